//! Memories: add, search (ranked full-text), list, get and delete, for one sandbox or for
//! the caller as an owner; and the memories a sandbox made from a snapshot starts with (what
//! its origin had when the snapshot was taken).
//!
//! A sandbox's memories are reached only through that sandbox, so they are the caller's
//! when the sandbox is; another owner's sandbox or memory is missing (`not_found`), never
//! forbidden. A sandbox's memories outlive it (a snapshot of it may hand them to a fork);
//! they are reachable as long as its record is.

use sandcell_api::SandboxId;
use sandcell_api::memories::{
    AddMemory, DEFAULT_CATEGORY, DEFAULT_LIST_LIMIT, DEFAULT_SEARCH_LIMIT, ListMemories,
    MAX_LIST_LIMIT, MAX_MEMORIES, MAX_SEARCH_LIMIT, Memory, MemoryList, MemoryScope,
    SearchMemories,
};
use sandcell_api::rules::check_record_id;
use sandcell_api::time::rfc3339;
use sandcell_engine::fleet::now_ms;
use sandcell_store::{MemoryRecord, SnapshotRecord};

use crate::caller::new_record_id;
use crate::{Caller, ErrorKind, Service, ServiceError, ServiceResult};

/// The prefix of memory ids (`mem-0123456789abcdef`).
pub const MEMORY_ID_PREFIX: &str = "mem";

/// Which memories an operation works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// One sandbox's, which must be the caller's.
    Sandbox(&'a SandboxId),
    /// The caller's own (not of any sandbox) for add, list and search. For get and delete,
    /// which name a memory by id, any of the caller's memories, a sandbox's included (the
    /// id is unique, and its `sandbox_id` says where it belongs).
    Owner,
}

/// A memory's record as the API shows it, with its score in search results.
pub fn memory_info(r: &MemoryRecord, score: Option<f64>) -> Memory {
    Memory {
        id: r.id.clone(),
        scope: if r.sandbox_id.is_some() {
            MemoryScope::Sandbox
        } else {
            MemoryScope::Owner
        },
        sandbox_id: r.sandbox_id.clone(),
        text: r.text.clone(),
        category: r.category.clone(),
        metadata: r.metadata.clone(),
        created_at: rfc3339(r.created_at),
        score,
    }
}

/// `limit` checked against `1..=max`, or `default` when absent.
fn limit(asked: Option<u32>, default: u32, max: u32) -> ServiceResult<u32> {
    match asked {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(n) => Err(ServiceError::invalid(format!(
            "'limit' must be 1 to {max}, got {n}"
        ))),
    }
}

impl Service {
    /// The sandbox of `scope` (checked to be the caller's), or `None` for the owner's own.
    fn memory_sandbox<'a>(
        &self,
        caller: &Caller,
        scope: Scope<'a>,
    ) -> ServiceResult<Option<&'a SandboxId>> {
        match scope {
            Scope::Sandbox(id) => {
                self.fleet.get(&caller.owner, id)?;
                Ok(Some(id))
            }
            Scope::Owner => Ok(None),
        }
    }

    /// The caller's memory `id` in `scope` (see [`Scope`]); any other is missing.
    fn own_memory(
        &self,
        caller: &Caller,
        scope: Scope<'_>,
        id: &str,
    ) -> ServiceResult<MemoryRecord> {
        check_record_id(id, MEMORY_ID_PREFIX, "a memory")?;
        let sandbox = self.memory_sandbox(caller, scope)?;
        self.store
            .get_memory(id)?
            .filter(|m| m.owner == caller.owner)
            .filter(|m| match sandbox {
                Some(sb) => m.sandbox_id.as_deref() == Some(sb.as_str()),
                None => true,
            })
            .ok_or_else(|| ServiceError::not_found("memory", id))
    }

    /// Remembers something in `scope`; a scope holds at most [`MAX_MEMORIES`].
    pub fn add_memory(
        &self,
        caller: &Caller,
        scope: Scope<'_>,
        req: AddMemory,
    ) -> ServiceResult<Memory> {
        let sandbox = self.memory_sandbox(caller, scope)?;
        let record = MemoryRecord {
            seq: 0,
            id: new_record_id(MEMORY_ID_PREFIX)?,
            owner: caller.owner.clone(),
            sandbox_id: sandbox.map(|s| s.to_string()),
            text: req.text.into_string(),
            category: req
                .category
                .map_or_else(|| DEFAULT_CATEGORY.to_string(), |c| c.into_string()),
            metadata: req.metadata.into_inner(),
            created_at: now_ms(),
        };
        if !self.store.insert_memory(&record, MAX_MEMORIES)? {
            let whose = match sandbox {
                Some(sb) => format!("sandbox {sb}"),
                None => format!("owner {}", caller.owner),
            };
            return Err(ServiceError::new(
                ErrorKind::LimitExceeded,
                format!(
                    "{whose} holds {MAX_MEMORIES} memories, the most one scope may: delete some first"
                ),
            ));
        }
        self.audit(
            caller,
            "memory.add",
            Some(&record.id),
            serde_json::json!({"sandbox": record.sandbox_id, "category": record.category}),
        );
        Ok(memory_info(&record, None))
    }

    /// The memories of `scope` matching the query's words, most relevant first (bm25 over
    /// the full-text index; ties newest first). A query without a letter or digit finds
    /// nothing.
    pub fn search_memories(
        &self,
        caller: &Caller,
        scope: Scope<'_>,
        req: SearchMemories,
    ) -> ServiceResult<MemoryList> {
        let limit = limit(req.limit, DEFAULT_SEARCH_LIMIT, MAX_SEARCH_LIMIT)?;
        let sandbox = self.memory_sandbox(caller, scope)?;
        let hits = self.store.search_memories(
            &caller.owner,
            sandbox.map(|s| s.as_str()),
            req.query.as_str(),
            req.category.as_deref(),
            limit,
        )?;
        Ok(MemoryList {
            memories: hits
                .iter()
                .map(|h| memory_info(&h.memory, Some(h.score)))
                .collect(),
            next_cursor: None,
        })
    }

    /// A page of the memories of `scope`, newest first.
    pub fn list_memories(
        &self,
        caller: &Caller,
        scope: Scope<'_>,
        req: ListMemories,
    ) -> ServiceResult<MemoryList> {
        let limit = limit(req.limit, DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)?;
        let before = req
            .cursor
            .as_deref()
            .map(|c| {
                c.parse::<i64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| ServiceError::invalid(format!("invalid page cursor '{c}'")))
            })
            .transpose()?;
        let sandbox = self.memory_sandbox(caller, scope)?;
        let page = self.store.list_memories(
            &caller.owner,
            sandbox.map(|s| s.as_str()),
            req.category.as_deref(),
            limit,
            before,
        )?;
        Ok(MemoryList {
            memories: page.items.iter().map(|m| memory_info(m, None)).collect(),
            next_cursor: page.next_cursor,
        })
    }

    /// One memory of the caller's (see [`Scope`] for which).
    pub fn get_memory(&self, caller: &Caller, scope: Scope<'_>, id: &str) -> ServiceResult<Memory> {
        Ok(memory_info(&self.own_memory(caller, scope, id)?, None))
    }

    /// Forgets a memory of the caller's (see [`Scope`] for which). A sandbox made later from
    /// a snapshot taken before this still has it, as its origin had it then.
    pub fn delete_memory(&self, caller: &Caller, scope: Scope<'_>, id: &str) -> ServiceResult<()> {
        let record = self.own_memory(caller, scope, id)?;
        if !self.store.delete_memory(&record.id, now_ms())? {
            // Deleted by another request in between.
            return Err(ServiceError::not_found("memory", id));
        }
        self.audit(
            caller,
            "memory.delete",
            Some(&record.id),
            serde_json::json!({"sandbox": record.sandbox_id}),
        );
        Ok(())
    }

    /// Gives sandbox `sandbox_id`, just made from `snapshot`, the memories the snapshot's
    /// sandbox had when it was taken (copies with ids of their own, and their original
    /// times); all or none. How many.
    pub(crate) fn inherit_memories(
        &self,
        snapshot: &SnapshotRecord,
        sandbox_id: &str,
    ) -> ServiceResult<usize> {
        let then =
            self.store
                .memories_at(&snapshot.owner, &snapshot.sandbox_id, snapshot.created_at)?;
        let copies = then
            .into_iter()
            .map(|m| {
                Ok(MemoryRecord {
                    seq: 0,
                    id: new_record_id(MEMORY_ID_PREFIX)?,
                    sandbox_id: Some(sandbox_id.to_string()),
                    ..m
                })
            })
            .collect::<ServiceResult<Vec<_>>>()?;
        self.store.insert_memories(&copies)?;
        Ok(copies.len())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use sandcell_api::memories::{Category, MemoryQuery, MemoryText};
    use sandcell_engine::fleet::Fleet;
    use sandcell_engine::{Engine, SandboxSpec};
    use sandcell_store::Store;

    use super::*;
    use crate::ledger::StoreLedger;
    use crate::signed_url::UrlSigner;

    /// A service over a real store and a fleet without backends: the sandboxes are records
    /// only, which is all memories look at.
    fn service() -> (tempfile::TempDir, Service) {
        let home = tempfile::tempdir().unwrap();
        let (config, _) = crate::config::load(home.path(), None, &[], &[]).unwrap();
        let store = Arc::new(Store::open(&config.database).unwrap());
        let fleet = Arc::new(Fleet::new(
            Engine::builder().build(),
            Arc::new(StoreLedger::new(store.clone())),
            config.fleet_limits(),
        ));
        let signer = UrlSigner::load_or_create(home.path()).unwrap();
        let service = Service::new(fleet, store, config, signer);
        (home, service)
    }

    fn caller(owner: &str) -> Caller {
        Caller {
            owner: owner.to_string(),
            key_id: format!("{owner}-key"),
            admin: false,
            request_id: None,
        }
    }

    fn sandbox(s: &Service, id: &str, owner: &str) -> SandboxId {
        s.store
            .insert_sandbox(&sandcell_store::SandboxRecord {
                id: id.to_string(),
                owner: owner.to_string(),
                state: "running".to_string(),
                reason: None,
                spec: serde_json::to_value(SandboxSpec::default()).unwrap(),
                labels: BTreeMap::new(),
                metadata: BTreeMap::new(),
                created_at: 1,
                updated_at: 1,
                last_active_at: 1,
                idle_timeout_ms: None,
                expires_at: None,
                ephemeral: false,
                runtime: serde_json::Value::Null,
            })
            .unwrap();
        SandboxId::parse(id).unwrap()
    }

    fn add(s: &Service, c: &Caller, scope: Scope<'_>, text: &str) -> Memory {
        s.add_memory(c, scope, AddMemory::text(MemoryText::new(text).unwrap()))
            .unwrap()
    }

    fn search(s: &Service, c: &Caller, scope: Scope<'_>, q: &str) -> Vec<String> {
        s.search_memories(c, scope, SearchMemories::new(MemoryQuery::new(q).unwrap()))
            .unwrap()
            .memories
            .into_iter()
            .map(|m| m.id)
            .collect()
    }

    #[test]
    fn memories_are_scoped_to_their_sandbox_or_owner() {
        let (_home, s) = service();
        let (alice, bob) = (caller("alice"), caller("bob"));
        let sb = sandbox(&s, "sb-alice", "alice");
        let in_sb = add(
            &s,
            &alice,
            Scope::Sandbox(&sb),
            "the deploy key is in vault",
        );
        assert_eq!(
            (
                in_sb.scope,
                in_sb.sandbox_id.as_deref(),
                in_sb.category.as_str()
            ),
            (MemoryScope::Sandbox, Some("sb-alice"), DEFAULT_CATEGORY)
        );
        assert!(in_sb.id.starts_with("mem-"));
        let own = add(&s, &alice, Scope::Owner, "alice writes British English");
        assert_eq!((own.scope, own.sandbox_id), (MemoryScope::Owner, None));

        assert_eq!(
            search(&s, &alice, Scope::Sandbox(&sb), "deploy"),
            [in_sb.id.as_str()]
        );
        assert!(search(&s, &alice, Scope::Owner, "deploy").is_empty());
        assert_eq!(
            search(&s, &alice, Scope::Owner, "english"),
            [own.id.as_str()]
        );
        // By id under the owner: any of alice's; under a sandbox: only that sandbox's.
        assert_eq!(
            s.get_memory(&alice, Scope::Owner, &in_sb.id).unwrap().id,
            in_sb.id
        );
        let err = s
            .get_memory(&alice, Scope::Sandbox(&sb), &own.id)
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotFound);

        // Bob sees none of it, as missing.
        for err in [
            s.add_memory(
                &bob,
                Scope::Sandbox(&sb),
                AddMemory::text(MemoryText::new("mine now").unwrap()),
            )
            .unwrap_err(),
            s.search_memories(
                &bob,
                Scope::Sandbox(&sb),
                SearchMemories::new(MemoryQuery::new("deploy").unwrap()),
            )
            .unwrap_err(),
            s.list_memories(&bob, Scope::Sandbox(&sb), ListMemories::default())
                .unwrap_err(),
            s.get_memory(&bob, Scope::Owner, &own.id).unwrap_err(),
            s.get_memory(&bob, Scope::Owner, &in_sb.id).unwrap_err(),
            s.delete_memory(&bob, Scope::Owner, &own.id).unwrap_err(),
        ] {
            assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
        }
        assert!(search(&s, &bob, Scope::Owner, "english").is_empty());

        // Deleted: gone from search and get; a second delete is missing.
        s.delete_memory(&alice, Scope::Sandbox(&sb), &in_sb.id)
            .unwrap();
        assert!(search(&s, &alice, Scope::Sandbox(&sb), "deploy").is_empty());
        let err = s
            .delete_memory(&alice, Scope::Owner, &in_sb.id)
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotFound);
        // A malformed id is invalid, not missing.
        let err = s.get_memory(&alice, Scope::Owner, "mem-x").unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn lists_page_filter_and_check_their_limits() {
        let (_home, s) = service();
        let alice = caller("alice");
        for i in 0..5 {
            let mut req = AddMemory::text(MemoryText::new(format!("note {i}")).unwrap());
            if i % 2 == 0 {
                req.category = Some(Category::new("even").unwrap());
            }
            s.add_memory(&alice, Scope::Owner, req).unwrap();
        }
        let first = s
            .list_memories(
                &alice,
                Scope::Owner,
                ListMemories {
                    limit: Some(3),
                    ..ListMemories::default()
                },
            )
            .unwrap();
        assert_eq!(first.memories[0].text, "note 4");
        let rest = s
            .list_memories(
                &alice,
                Scope::Owner,
                ListMemories {
                    cursor: first.next_cursor.clone(),
                    ..ListMemories::default()
                },
            )
            .unwrap();
        let texts: Vec<&str> = rest.memories.iter().map(|m| m.text.as_str()).collect();
        assert_eq!(texts, ["note 1", "note 0"]);
        let even = s
            .list_memories(
                &alice,
                Scope::Owner,
                ListMemories {
                    category: Some(Category::new("even").unwrap()),
                    ..ListMemories::default()
                },
            )
            .unwrap();
        assert_eq!(even.memories.len(), 3);
        for bad in [
            ListMemories {
                limit: Some(0),
                ..ListMemories::default()
            },
            ListMemories {
                cursor: Some("abc".into()),
                ..ListMemories::default()
            },
        ] {
            let err = s.list_memories(&alice, Scope::Owner, bad).unwrap_err();
            assert_eq!(err.kind, ErrorKind::InvalidArgument);
        }
        let mut req = SearchMemories::new(MemoryQuery::new("note").unwrap());
        req.limit = Some(MAX_SEARCH_LIMIT + 1);
        let err = s.search_memories(&alice, Scope::Owner, req).unwrap_err();
        assert!(err.message.contains("'limit'"), "{err}");
        let mut req = SearchMemories::new(MemoryQuery::new("note").unwrap());
        req.limit = Some(2);
        let found = s.search_memories(&alice, Scope::Owner, req).unwrap();
        assert_eq!(found.memories.len(), 2);
        assert!(found.memories.iter().all(|m| m.score.is_some()));
    }

    #[test]
    fn a_sandbox_made_from_a_snapshot_inherits_what_its_origin_had_then() {
        let (_home, s) = service();
        let alice = caller("alice");
        let origin = sandbox(&s, "sb-origin", "alice");
        let before = add(&s, &alice, Scope::Sandbox(&origin), "the api port is 8080");
        let gone_later = add(&s, &alice, Scope::Sandbox(&origin), "the cache is redis");
        let taken = SnapshotRecord {
            id: "sn-00000000000000a1".into(),
            owner: "alice".into(),
            sandbox_id: origin.to_string(),
            parent_id: None,
            name: "n".into(),
            description: String::new(),
            tags: BTreeMap::new(),
            fidelity: "files".into(),
            created_at: now_ms(),
            size: 0,
            manifest: serde_json::json!({}),
            path: "/nowhere".into(),
        };
        s.store.insert_snapshot(&taken).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        add(
            &s,
            &alice,
            Scope::Sandbox(&origin),
            "the api port moved to 9090",
        );
        s.delete_memory(&alice, Scope::Sandbox(&origin), &gone_later.id)
            .unwrap();

        let fork = sandbox(&s, "sb-fork", "alice");
        assert_eq!(s.inherit_memories(&taken, &fork).unwrap(), 2);
        let seen = s
            .list_memories(&alice, Scope::Sandbox(&fork), ListMemories::default())
            .unwrap()
            .memories;
        let mut texts: Vec<&str> = seen.iter().map(|m| m.text.as_str()).collect();
        texts.sort_unstable();
        assert_eq!(texts, ["the api port is 8080", "the cache is redis"]);
        // Copies: ids of their own, the original's time, the fork's sandbox.
        let copy = seen.iter().find(|m| m.text == before.text).unwrap();
        assert_ne!(copy.id, before.id);
        assert_eq!(
            (copy.created_at.as_str(), copy.sandbox_id.as_deref()),
            (before.created_at.as_str(), Some("sb-fork"))
        );
        assert!(search(&s, &alice, Scope::Sandbox(&fork), "9090").is_empty());
        // The origin keeps its own.
        assert_eq!(search(&s, &alice, Scope::Sandbox(&origin), "9090").len(), 1);
    }
}
