//! API keys: create, list, revoke. A key acts for its owner; an admin key may also manage
//! other owners' keys. Another owner's key is reported as missing, never as forbidden.

use sandcell_api::keys::{CreateKey, KeyInfo, KeyList, NewKey, check_key_id, check_key_name};
use sandcell_api::rules::check_owner;
use sandcell_api::time::rfc3339;
use sandcell_store::ApiKeyRecord;

use crate::caller::new_key;
use crate::{Caller, Service, ServiceError, ServiceResult};

/// What the API says about a key (never its secret).
pub fn key_info(k: &ApiKeyRecord) -> KeyInfo {
    KeyInfo {
        id: k.id.clone(),
        owner: k.owner.clone(),
        name: k.name.clone(),
        prefix: k.prefix.clone(),
        admin: k.admin,
        created_at: rfc3339(k.created_at),
        last_used_at: k.last_used_at.map(rfc3339),
        revoked_at: k.revoked_at.map(rfc3339),
    }
}

/// Whether `caller` may create a key for `owner` (an admin one when `admin`): a key for
/// another owner, or an admin key, needs an admin key.
pub fn check_may_create(caller: &Caller, owner: &str, admin: bool) -> ServiceResult<()> {
    if (owner != caller.owner || admin) && !caller.admin {
        return Err(ServiceError::forbidden(
            "only an admin key can create keys for another owner or admin keys",
        ));
    }
    Ok(())
}

/// Whose keys `caller` sees when it asks for `owner`'s (`None`: everyone's): an admin key
/// sees what it asks for, any other key only its own owner's.
pub fn key_scope(caller: &Caller, owner: Option<String>) -> Option<String> {
    if caller.admin {
        owner
    } else {
        Some(caller.owner.clone())
    }
}

/// Whether `caller` may see (and revoke) `key`.
pub fn may_see(caller: &Caller, key: &ApiKeyRecord) -> bool {
    caller.admin || key.owner == caller.owner
}

impl Service {
    /// Creates a key (for the caller's owner unless an admin key asks for another); its
    /// secret is in the answer, this once.
    pub fn create_key(&self, caller: &Caller, req: CreateKey) -> ServiceResult<NewKey> {
        let name = req.name.trim();
        check_key_name(name)?;
        let owner = req.owner.unwrap_or_else(|| caller.owner.clone());
        check_owner(&owner)?;
        check_may_create(caller, &owner, req.admin)?;
        let (record, secret) = new_key(&owner, name, req.admin)?;
        self.store.insert_key(&record)?;
        self.audit(
            caller,
            "key.create",
            Some(&record.id),
            serde_json::json!({"owner": owner, "admin": req.admin}),
        );
        Ok(NewKey {
            key: secret,
            info: key_info(&record),
        })
    }

    /// Lists keys, oldest first: the caller's owner's, or (admin) everyone's or `owner`'s.
    pub fn list_keys(&self, caller: &Caller, owner: Option<&str>) -> ServiceResult<KeyList> {
        if let Some(owner) = owner {
            check_owner(owner)?;
        }
        let scope = key_scope(caller, owner.map(str::to_string));
        let keys = self.store.list_keys(scope.as_deref())?;
        Ok(KeyList {
            keys: keys.iter().map(key_info).collect(),
        })
    }

    /// Revokes a key at once (the caller's own included); the key cache forgets every key,
    /// so the revocation holds on the next request.
    pub fn revoke_key(&self, caller: &Caller, key_id: &str) -> ServiceResult<()> {
        check_key_id(key_id)?;
        let visible = self.store.get_key(key_id)?.filter(|k| may_see(caller, k));
        if visible.is_none() {
            return Err(ServiceError::not_found("key", key_id));
        }
        self.store
            .revoke_key(key_id, sandcell_engine::fleet::now_ms())?;
        self.keys.clear();
        self.audit(caller, "key.revoke", Some(key_id), serde_json::Value::Null);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn caller(owner: &str, admin: bool) -> Caller {
        Caller {
            owner: owner.into(),
            key_id: "k".into(),
            admin,
            request_id: None,
        }
    }

    #[test]
    fn only_admin_keys_create_for_others_or_create_admins() {
        let alice = caller("alice", false);
        let root = caller("root", true);
        assert!(check_may_create(&alice, "alice", false).is_ok());
        for (owner, admin) in [("bob", false), ("alice", true)] {
            let e = check_may_create(&alice, owner, admin).unwrap_err();
            assert_eq!(e.kind, ErrorKind::PermissionDenied);
        }
        assert!(check_may_create(&root, "bob", true).is_ok());
    }

    #[test]
    fn keys_are_seen_by_their_owner_and_admins() {
        let alice = caller("alice", false);
        let root = caller("root", true);
        assert_eq!(key_scope(&alice, Some("bob".into())), Some("alice".into()));
        assert_eq!(key_scope(&alice, None), Some("alice".into()));
        assert_eq!(key_scope(&root, None), None);
        assert_eq!(key_scope(&root, Some("bob".into())), Some("bob".into()));
        let (bobs, _) = new_key("bob", "laptop", false).unwrap();
        assert!(!may_see(&alice, &bobs));
        assert!(may_see(&root, &bobs));
        assert!(may_see(&caller("bob", false), &bobs));
    }

    #[test]
    fn a_key_record_never_shows_its_secret() {
        let (record, secret) = new_key("alice", "ci", true).unwrap();
        let info = key_info(&record);
        assert_eq!((info.owner.as_str(), info.admin), ("alice", true));
        assert!(secret.starts_with(&info.prefix));
        let json = serde_json::to_string(&info).unwrap();
        assert!(!json.contains(&secret), "{json}");
        assert_eq!(info.last_used_at, None);
    }
}

#[cfg(test)]
mod service_tests {
    use sandcell_api::keys::CreateKey;

    use crate::ErrorKind;
    use crate::system::testing::{caller, service};

    fn create(name: &str, owner: Option<&str>, admin: bool) -> CreateKey {
        CreateKey {
            name: name.into(),
            owner: owner.map(str::to_string),
            admin,
        }
    }

    #[test]
    fn keys_are_created_listed_and_revoked_within_their_owner() {
        let h = service(&[]);
        let s = &h.service;
        let (alice, root) = (caller("alice", false), caller("root", true));
        let made = s
            .create_key(&alice, create("  laptop ", None, false))
            .unwrap();
        assert_eq!(
            (made.info.owner.as_str(), made.info.name.as_str()),
            ("alice", "laptop")
        );
        let bobs = s
            .create_key(&root, create("ci", Some("bob"), false))
            .unwrap();
        // Alice sees only hers, whatever she asks for; the admin sees what it asks for.
        let ids = |l: sandcell_api::keys::KeyList| -> Vec<String> {
            l.keys.into_iter().map(|k| k.id).collect()
        };
        assert_eq!(
            ids(s.list_keys(&alice, Some("bob")).unwrap()),
            vec![made.info.id.clone()]
        );
        assert_eq!(
            ids(s.list_keys(&root, Some("bob")).unwrap()),
            vec![bobs.info.id.clone()]
        );
        assert_eq!(s.list_keys(&root, None).unwrap().keys.len(), 2);
        // Another owner's key is missing to her; a malformed id or owner is invalid.
        let e = s.revoke_key(&alice, &bobs.info.id).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        for e in [
            s.revoke_key(&alice, "not-hex").unwrap_err(),
            s.list_keys(&alice, Some("a b")).unwrap_err(),
            s.create_key(&alice, create("", None, false)).unwrap_err(),
            s.create_key(&root, create("x", Some("a/b"), false))
                .unwrap_err(),
        ] {
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        }
        let e = s
            .create_key(&alice, create("x", Some("bob"), false))
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied);
        // A revoked key no longer authenticates.
        let store = &s.store;
        assert!(s.keys.authenticate(store, &made.key).unwrap().is_some());
        s.revoke_key(&alice, &made.info.id).unwrap();
        assert!(s.keys.authenticate(store, &made.key).unwrap().is_none());
        let listed = s.list_keys(&alice, None).unwrap();
        assert!(listed.keys[0].revoked_at.is_some());
    }
}
