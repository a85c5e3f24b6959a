//! API keys.

use sandcell_store::{Store, StoreError, hash_secret};

use super::{file_store, key};

#[test]
fn hash_is_sha256_hex_not_the_secret() {
    assert_eq!(
        hash_secret("abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    let secret = "sc_live_0123456789abcdef";
    let hash = hash_secret(secret);
    assert_ne!(hash, secret);
    assert!(!hash.contains(secret));
    assert_eq!(hash.len(), 64);
    assert_ne!(hash_secret("sc_live_0123456789abcdeg"), hash);
}

#[test]
fn a_key_is_found_by_its_secret_only() {
    let store = Store::open_in_memory().unwrap();
    let record = key("k1", "alice", "sc_secret_one", 10);
    store.insert_key(&record).unwrap();
    assert_eq!(
        store.key_by_secret("sc_secret_one").unwrap(),
        Some(record.clone())
    );
    assert_eq!(store.key_by_secret("sc_secret_two").unwrap(), None);
    // Knowing the stored hash is not knowing the secret.
    assert_eq!(store.key_by_secret(&record.hash).unwrap(), None);
    assert_eq!(store.get_key("k1").unwrap(), Some(record));
}

#[test]
fn the_secret_never_reaches_the_database_file() {
    let (_dir, path, store) = file_store();
    let secret = "sc_very_distinctive_secret_9f8e7d";
    store.insert_key(&key("k1", "alice", secret, 1)).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let mut wal = path.clone().into_os_string();
    wal.push("-wal");
    bytes.extend(std::fs::read(&wal).unwrap_or_default());
    let hash = hash_secret(secret);
    let contains = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(contains(hash.as_bytes()), "the hash should be stored");
    assert!(!contains(secret.as_bytes()), "the secret is in the file");
}

#[test]
fn revoked_keys_do_not_authenticate_but_are_listed() {
    let store = Store::open_in_memory().unwrap();
    store
        .insert_key(&key("k1", "alice", "secret-1", 1))
        .unwrap();
    store
        .insert_key(&key("k2", "alice", "secret-2", 2))
        .unwrap();
    store.insert_key(&key("k3", "bob", "secret-3", 3)).unwrap();

    assert!(store.revoke_key("k1", 50).unwrap());
    assert_eq!(store.key_by_secret("secret-1").unwrap(), None);
    assert!(store.key_by_secret("secret-2").unwrap().is_some());
    // Revoking again keeps the first time; an unknown key is reported.
    assert!(store.revoke_key("k1", 60).unwrap());
    assert!(!store.revoke_key("nope", 60).unwrap());

    let alice = store.list_keys(Some("alice")).unwrap();
    assert_eq!(
        alice
            .iter()
            .map(|k| (k.id.as_str(), k.revoked_at))
            .collect::<Vec<_>>(),
        [("k1", Some(50)), ("k2", None)]
    );
    assert_eq!(store.list_keys(None).unwrap().len(), 3);
    assert_eq!(store.list_keys(Some("carol")).unwrap(), []);
    assert_eq!(store.count_keys().unwrap(), 3);
}

#[test]
fn touch_key_records_the_last_use() {
    let store = Store::open_in_memory().unwrap();
    store
        .insert_key(&key("k1", "alice", "secret-1", 1))
        .unwrap();
    store.touch_key("k1", 100).unwrap();
    store.touch_key("k1", 90).unwrap();
    assert_eq!(
        store.get_key("k1").unwrap().unwrap().last_used_at,
        Some(100)
    );
    assert!(matches!(
        store.touch_key("nope", 1),
        Err(StoreError::NotFound {
            what: "api key",
            ..
        })
    ));
}

#[test]
fn duplicate_ids_and_duplicate_secrets_are_refused() {
    let store = Store::open_in_memory().unwrap();
    store
        .insert_key(&key("k1", "alice", "secret-1", 1))
        .unwrap();
    match store.insert_key(&key("k1", "bob", "secret-2", 2)) {
        Err(StoreError::AlreadyExists { what, id }) => {
            assert_eq!((what, id.as_str()), ("api key", "k1"));
        }
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    match store.insert_key(&key("k2", "bob", "secret-1", 2)) {
        Err(StoreError::AlreadyExists { what, .. }) => assert_eq!(what, "api key secret"),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    assert_eq!(store.count_keys().unwrap(), 1);
    assert_eq!(
        store.key_by_secret("secret-1").unwrap().unwrap().owner,
        "alice"
    );
}

#[test]
fn admin_flag_round_trips() {
    let store = Store::open_in_memory().unwrap();
    let mut admin = key("root", "admin", "secret-root", 1);
    admin.admin = true;
    store.insert_key(&admin).unwrap();
    assert!(store.key_by_secret("secret-root").unwrap().unwrap().admin);
}
