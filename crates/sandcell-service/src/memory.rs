//! Memories: add, search (ranked full-text, hybrid with embeddings when configured), list,
//! get and delete, for one sandbox or for the caller as an owner; facts extracted from a text
//! by a model in the background (infer jobs); and the memories a sandbox made from a snapshot
//! starts with (what its origin had when the snapshot was taken).
//!
//! A sandbox's memories are reached only through that sandbox, so they are the caller's
//! when the sandbox is; another owner's sandbox or memory is missing (`not_found`), never
//! forbidden. A sandbox's memories outlive it (a snapshot of it may hand them to a fork);
//! they are reachable as long as its record is.
//!
//! With `memory.embedding_model` set, an added memory is embedded (through the
//! OpenAI-compatible `/embeddings` endpoint of `agent.openai`) and its vector stored with it;
//! a search embeds the query and fuses the full-text ranking with the vectors' cosine ranking
//! by reciprocal rank, so a memory sharing no word with the query is found too. The endpoint
//! failing never loses a memory or a search: the memory is stored without a vector (and
//! says so), the search ranks by words only and says so (`ranking: fts`, `warning`). A later
//! hybrid search embeds memories that have no vector yet, [`BACKFILL_PER_SEARCH`] at a time.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sandcell_api::memories::{
    AddMemory, DEFAULT_CATEGORY, DEFAULT_LIST_LIMIT, DEFAULT_SEARCH_LIMIT, InferJob, InferJobList,
    InferMemories, InferStatus, ListInferJobs, ListMemories, MAX_INFER_FACTS, MAX_LIST_LIMIT,
    MAX_MEMORIES, MAX_SEARCH_LIMIT, MatchedBy, Memory, MemoryList, MemoryScope, MemoryText,
    Ranking, SearchMemories,
};
use sandcell_api::rules::check_record_id;
use sandcell_api::time::rfc3339;
use sandcell_api::{SandboxId, Tags};
use sandcell_engine::fleet::now_ms;
use sandcell_llm::{ChatRequest, Llm, LlmConfig, Message, ModelRef, RetryPolicy};
use sandcell_store::{MemoryJobRecord, MemoryRecord, MemoryVector, SnapshotRecord};

use crate::caller::new_record_id;
use crate::config::Config;
use crate::{Caller, ErrorKind, Service, ServiceError, ServiceResult};

/// The prefix of memory ids (`mem-0123456789abcdef`).
pub const MEMORY_ID_PREFIX: &str = "mem";
/// The prefix of infer job ids (`inf-0123456789abcdef`).
pub const INFER_JOB_ID_PREFIX: &str = "inf";
/// Memories without a vector that one hybrid search embeds (with the query, in one call).
pub const BACKFILL_PER_SEARCH: u32 = 32;
/// The metadata key (and value) every memory an infer job adds carries.
pub const INFER_SOURCE: (&str, &str) = ("source", "infer");
/// Reciprocal rank fusion's constant: a result at rank r of a list adds 1 / (K + r).
const RRF_K: f64 = 60.0;
/// The most output tokens an infer call may use.
const INFER_MAX_TOKENS: u32 = 2048;

/// What the infer model is told.
const INFER_SYSTEM: &str = "You extract facts worth remembering from a text. Answer with a \
JSON list of strings and nothing else: each string is one short, self-contained fact in plain \
words (one sentence at most), understandable without the text. Answer [] when the text holds \
no such fact.";

/// Which memories an operation works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// One sandbox's, which must be the caller's.
    Sandbox(&'a SandboxId),
    /// The caller's own (not of any sandbox) for add, list, search and infer. For get and
    /// delete, which name a memory (or job) by id, any of the caller's, a sandbox's
    /// included (the id is unique, and its `sandbox_id` says where it belongs).
    Owner,
}

/// The models memories use, and the infer jobs this process runs.
pub struct MemoryModels {
    /// The embedding model, when configured.
    embedding_model: Option<ModelRef>,
    /// The client for embeddings: few, quick retries (an add or a search waits for it).
    embed_llm: Result<Llm, String>,
    /// The model infer jobs ask, when one is configured.
    infer_model: Option<ModelRef>,
    /// The client for infer calls: the providers' usual retries (nobody waits on them).
    infer_llm: Result<Llm, String>,
    /// The least similarity of a match by embedding.
    min_similarity: f32,
    /// This process, as infer jobs name their worker.
    worker: String,
    /// The infer jobs running in this process.
    live: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for MemoryModels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryModels")
            .field("embedding_model", &self.embedding_model)
            .field("infer_model", &self.infer_model)
            .field("worker", &self.worker)
            .finish_non_exhaustive()
    }
}

impl MemoryModels {
    /// From the settings (`[memory]`, and the providers of `[agent]`), reading keys and base
    /// URLs from the environment through `get`.
    pub fn from_config(config: &Config, get: impl Fn(&str) -> Option<String>) -> Self {
        let llm = crate::config::llm_config(&config.agent, get);
        let embed = LlmConfig {
            retry: RetryPolicy {
                max_retries: 1,
                base_delay: Duration::from_millis(200),
                max_delay: Duration::from_secs(2),
            },
            request_timeout: Duration::from_secs(30),
            ..llm.clone()
        };
        Self {
            embedding_model: config.memory.embedding_model(),
            embed_llm: Llm::new(embed).map_err(|e| e.message),
            infer_model: config.memory.infer_model(&config.agent),
            infer_llm: Llm::new(llm).map_err(|e| e.message),
            min_similarity: config.memory.min_similarity as f32,
            worker: process_token(std::process::id())
                .unwrap_or_else(|| format!("{}:unknown", std::process::id())),
            live: Mutex::new(HashSet::new()),
        }
    }

    /// The embedding model, when one is configured.
    pub fn embedding_model(&self) -> Option<&ModelRef> {
        self.embedding_model.as_ref()
    }

    /// The vectors of `texts` from the embedding model.
    async fn embed(&self, model: &ModelRef, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        let llm = self.embed_llm.as_ref().map_err(Clone::clone)?;
        llm.embed(model, texts)
            .await
            .map(|e| e.vectors)
            .map_err(|e| e.message)
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `pid:start time` (clock ticks after boot, from `/proc/<pid>/stat`): one process, never
/// another that reuses its pid later.
fn process_token(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count after its end.
    let rest = &stat[stat.rfind(')')? + 1..];
    let start = rest.split_whitespace().nth(19)?;
    Some(format!("{pid}:{start}"))
}

/// Whether the process a job names as its worker still runs.
fn worker_alive(token: &str) -> bool {
    let Some(pid) = token.split(':').next().and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    process_token(pid).is_some_and(|now| now == token)
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
        matched_by: None,
        similarity: None,
        warning: None,
    }
}

/// A job's record as the API shows it.
pub fn infer_job_info(j: &MemoryJobRecord) -> InferJob {
    InferJob {
        id: j.id.clone(),
        status: InferStatus::parse(&j.status).unwrap_or(InferStatus::Failed),
        scope: if j.sandbox_id.is_some() {
            MemoryScope::Sandbox
        } else {
            MemoryScope::Owner
        },
        sandbox_id: j.sandbox_id.clone(),
        model: j.model.clone(),
        category: j.category.clone(),
        memories: j.memories.clone(),
        error: j.error.clone(),
        created_at: rfc3339(j.created_at),
        updated_at: rfc3339(j.updated_at),
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

/// A listing's `cursor` (a `seq`), checked.
fn cursor(c: Option<&str>) -> ServiceResult<Option<i64>> {
    c.map(|c| {
        c.parse::<i64>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| ServiceError::invalid(format!("invalid page cursor '{c}'")))
    })
    .transpose()
}

/// The facts of a model's answer: a JSON list of strings (possibly in a fenced code block,
/// or as `{"facts": [...]}`), each trimmed, blanks and repeats left out. An answer of
/// another shape is an error that quotes its start.
pub fn parse_facts(answer: &str) -> Result<Vec<String>, String> {
    let mut text = answer.trim();
    if let Some(rest) = text.strip_prefix("```") {
        // The fence's info string (`json`) runs to the end of its line.
        let body = rest.split_once('\n').map_or("", |(_, b)| b);
        text = body.trim_end().strip_suffix("```").unwrap_or(body).trim();
    }
    let quoted = || {
        let cut: String = answer.trim().chars().take(200).collect();
        let more = if cut.len() < answer.trim().len() {
            "…"
        } else {
            ""
        };
        format!("the model's answer is not a JSON list of strings: {cut:?}{more}")
    };
    let value: serde_json::Value = serde_json::from_str(text).map_err(|_| quoted())?;
    let list = match &value {
        serde_json::Value::Array(items) => items,
        serde_json::Value::Object(o) => match o.get("facts") {
            Some(serde_json::Value::Array(items)) => items,
            _ => return Err(quoted()),
        },
        _ => return Err(quoted()),
    };
    let mut facts: Vec<String> = Vec::new();
    for item in list {
        let fact = item.as_str().ok_or_else(quoted)?.trim();
        if !fact.is_empty() && !facts.iter().any(|f| f == fact) {
            facts.push(fact.to_string());
        }
    }
    Ok(facts)
}

/// One ranked list's contribution to a result: its rank there (1-based).
#[derive(Default, Clone, Copy)]
struct Ranks {
    fts: Option<usize>,
    semantic: Option<(usize, f32)>,
}

/// Fuses the full-text hits (best first) and the embedding neighbours (most similar first)
/// by reciprocal rank: each list a memory is in adds `1 / (RRF_K + rank)`. Best first (ties:
/// newest first), at most `limit`, each saying which lists found it.
fn fuse(fts: Vec<MemoryRecord>, semantic: Vec<(MemoryRecord, f32)>, limit: usize) -> Vec<Memory> {
    let mut ranks: HashMap<i64, Ranks> = HashMap::new();
    let mut records: HashMap<i64, MemoryRecord> = HashMap::new();
    for (i, r) in fts.into_iter().enumerate() {
        ranks.entry(r.seq).or_default().fts = Some(i + 1);
        records.entry(r.seq).or_insert(r);
    }
    for (i, (r, sim)) in semantic.into_iter().enumerate() {
        ranks.entry(r.seq).or_default().semantic = Some((i + 1, sim));
        records.entry(r.seq).or_insert(r);
    }
    let mut scored: Vec<(f64, i64, Ranks)> = ranks
        .into_iter()
        .map(|(seq, r)| {
            let score = r.fts.map_or(0.0, |k| 1.0 / (RRF_K + k as f64))
                + r.semantic.map_or(0.0, |(k, _)| 1.0 / (RRF_K + k as f64));
            (score, seq, r)
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
    scored.truncate(limit);
    scored
        .into_iter()
        .filter_map(|(score, seq, r)| {
            let record = records.get(&seq)?;
            let mut m = memory_info(record, Some(score));
            m.matched_by = Some(match (r.fts, r.semantic) {
                (Some(_), Some(_)) => MatchedBy::Both,
                (None, Some(_)) => MatchedBy::Semantic,
                _ => MatchedBy::Fts,
            });
            m.similarity = r.semantic.map(|(_, s)| f64::from(s));
            Some(m)
        })
        .collect()
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

    /// Remembers something in `scope`; a scope holds at most [`MAX_MEMORIES`]. With an
    /// embedding model configured, its vector is stored with it; when the embeddings
    /// endpoint fails the memory is stored without one, and its `warning` says so.
    pub async fn add_memory(
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
        let mut warning = None;
        let vector = match self.memory.embedding_model() {
            None => None,
            Some(model) => match self
                .memory
                .embed(model, std::slice::from_ref(&record.text))
                .await
            {
                Ok(mut v) if !v.is_empty() => Some(MemoryVector {
                    model: model.to_string(),
                    vector: v.swap_remove(0),
                }),
                Ok(_) => None,
                Err(e) => {
                    tracing::warn!(memory = %record.id, error = %e, "a memory is stored without its embedding");
                    warning = Some(format!(
                        "stored without an embedding: the embeddings endpoint failed ({e}); a later hybrid search embeds it"
                    ));
                    None
                }
            },
        };
        if self
            .store
            .insert_memory_with(&record, MAX_MEMORIES, vector.as_ref())?
            .is_none()
        {
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
            serde_json::json!({"sandbox": record.sandbox_id, "category": record.category, "embedded": vector.is_some()}),
        );
        let mut made = memory_info(&record, None);
        made.warning = warning;
        Ok(made)
    }

    /// The memories of `scope` matching the query, best first. Without an embedding model:
    /// the query's words, by bm25 over the full-text index (ties newest first; a query
    /// without a letter or digit finds nothing), `ranking: fts`. With one: those fused with
    /// the memories nearest the query's embedding (`ranking: hybrid`); the memories that
    /// have no vector yet are embedded first, [`BACKFILL_PER_SEARCH`] at a time (the rest
    /// are matched by words only, and the `warning` says how many). The embeddings endpoint
    /// failing gives the full-text ranking, `ranking: fts` and a `warning` saying why.
    pub async fn search_memories(
        &self,
        caller: &Caller,
        scope: Scope<'_>,
        req: SearchMemories,
    ) -> ServiceResult<MemoryList> {
        let limit = limit(req.limit, DEFAULT_SEARCH_LIMIT, MAX_SEARCH_LIMIT)?;
        let sandbox = self.memory_sandbox(caller, scope)?.map(|s| s.as_str());
        let category = req.category.as_deref();
        let Some(model) = self.memory.embedding_model() else {
            let hits = self.store.search_memories(
                &caller.owner,
                sandbox,
                req.query.as_str(),
                category,
                limit,
            )?;
            return Ok(fts_list(hits, None));
        };
        // A deeper pool of each ranking than asked for, so fusion can promote what one of
        // them ranks lower.
        let pool = (limit * 2).clamp(20, 200);
        let hits = self.store.search_memories(
            &caller.owner,
            sandbox,
            req.query.as_str(),
            category,
            pool,
        )?;
        let model_name = model.to_string();
        let (missing, missing_total) = self.store.memories_without_vector(
            &caller.owner,
            sandbox,
            category,
            &model_name,
            BACKFILL_PER_SEARCH,
        )?;
        let mut inputs = Vec::with_capacity(missing.len() + 1);
        inputs.push(req.query.to_string());
        inputs.extend(missing.iter().map(|m| m.text.clone()));
        let mut vectors = match self.memory.embed(model, &inputs).await {
            Ok(v) if v.len() == inputs.len() => v,
            Ok(v) => {
                let why = format!("{} vectors for {} texts", v.len(), inputs.len());
                return Ok(fts_fallback(hits, limit, &why));
            }
            Err(e) => return Ok(fts_fallback(hits, limit, &e)),
        };
        let query = vectors.remove(0);
        let backfill: Vec<(i64, MemoryVector)> = missing
            .iter()
            .zip(vectors)
            .map(|(m, vector)| {
                (
                    m.seq,
                    MemoryVector {
                        model: model_name.clone(),
                        vector,
                    },
                )
            })
            .collect();
        self.store.put_memory_vectors(&backfill)?;
        let near = self.store.nearest_memories(
            &caller.owner,
            sandbox,
            category,
            &model_name,
            &query,
            pool,
            self.memory.min_similarity,
        )?;
        let left = missing_total.saturating_sub(backfill.len() as u64);
        Ok(MemoryList {
            memories: fuse(
                hits.into_iter().map(|h| h.memory).collect(),
                near,
                limit as usize,
            ),
            next_cursor: None,
            ranking: Some(Ranking::Hybrid),
            warning: (left > 0).then(|| {
                format!(
                    "{left} memories of this scope have no embedding yet and were matched by their words only; later searches embed them, {BACKFILL_PER_SEARCH} at a time"
                )
            }),
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
        let before = cursor(req.cursor.as_deref())?;
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
            ranking: None,
            warning: None,
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

    /// Starts a job that asks the infer model (`memory.infer_model`, else `agent.model`) for
    /// the facts in `req.text` and adds each as a memory of `scope` (the request's category
    /// and metadata, plus `source: infer`); answers at once, `queued`. No model configured,
    /// or no key for its official endpoint, is an `invalid_argument` error at once.
    pub async fn infer_memories(
        self: &Arc<Self>,
        caller: &Caller,
        scope: Scope<'_>,
        req: InferMemories,
    ) -> ServiceResult<InferJob> {
        let sandbox = self.memory_sandbox(caller, scope)?.cloned();
        let Some(model) = self.memory.infer_model.clone() else {
            return Err(ServiceError::invalid(
                "no model to infer memories with: set memory.infer_model (or agent.model) to provider/model",
            ));
        };
        let llm = self
            .memory
            .infer_llm
            .as_ref()
            .map_err(|e| ServiceError::internal(format!("the model client: {e}")))?;
        let pc = llm.config().provider(model.provider);
        if pc.api_key.as_deref().is_none_or(str::is_empty) && pc.is_official(model.provider) {
            return Err(ServiceError::invalid(format!(
                "cannot infer memories with {model}: no API key for {}: set {}",
                model.provider, pc.key_env
            )));
        }
        let mut metadata: BTreeMap<String, String> = req.metadata.into_inner();
        metadata.insert(INFER_SOURCE.0.to_string(), INFER_SOURCE.1.to_string());
        // The added memories' metadata must pass the rule the request's did.
        let metadata = Tags::new(metadata)
            .map_err(|e| ServiceError::invalid(format!("metadata: {e} (with source=infer added)")))?
            .into_inner();
        let now = now_ms();
        let job = MemoryJobRecord {
            seq: 0,
            id: new_record_id(INFER_JOB_ID_PREFIX)?,
            owner: caller.owner.clone(),
            sandbox_id: sandbox.as_ref().map(ToString::to_string),
            status: InferStatus::Queued.as_str().to_string(),
            model: model.to_string(),
            text: req.text.into_string(),
            category: req
                .category
                .map_or_else(|| DEFAULT_CATEGORY.to_string(), |c| c.into_string()),
            metadata,
            memories: Vec::new(),
            error: None,
            worker: self.memory.worker.clone(),
            created_at: now,
            updated_at: now,
        };
        // Live before it is visible, so no reader takes it for interrupted.
        self.memory.live().insert(job.id.clone());
        if let Err(e) = self.store.insert_memory_job(&job) {
            self.memory.live().remove(&job.id);
            return Err(e.into());
        }
        self.audit(
            caller,
            "memory.infer",
            Some(&job.id),
            serde_json::json!({"sandbox": job.sandbox_id, "model": job.model}),
        );
        let info = infer_job_info(&job);
        let service = self.clone();
        let caller = caller.clone();
        tokio::spawn(async move {
            service.run_infer_job(&caller, sandbox, model, job).await;
        });
        Ok(info)
    }

    /// Runs one infer job to its end, recording each status.
    async fn run_infer_job(
        &self,
        caller: &Caller,
        sandbox: Option<SandboxId>,
        model: ModelRef,
        job: MemoryJobRecord,
    ) {
        let mut added: Vec<String> = Vec::new();
        let outcome = self
            .infer_job_steps(caller, sandbox.as_ref(), &model, &job, &mut added)
            .await;
        let (status, error) = match &outcome {
            Ok(()) => (InferStatus::Succeeded, None),
            Err(e) => (InferStatus::Failed, Some(e.as_str())),
        };
        if let Err(e) =
            self.store
                .update_memory_job(&job.id, status.as_str(), &added, error, now_ms())
        {
            tracing::warn!(job = %job.id, error = %e, "could not record an infer job's end");
        }
        self.memory.live().remove(&job.id);
    }

    async fn infer_job_steps(
        &self,
        caller: &Caller,
        sandbox: Option<&SandboxId>,
        model: &ModelRef,
        job: &MemoryJobRecord,
        added: &mut Vec<String>,
    ) -> Result<(), String> {
        self.store
            .update_memory_job(&job.id, InferStatus::Running.as_str(), &[], None, now_ms())
            .map_err(|e| format!("the store: {e}"))?;
        let llm = self.memory.infer_llm.as_ref().map_err(Clone::clone)?;
        let req = ChatRequest {
            model: model.model.clone(),
            system: Some(INFER_SYSTEM.to_string()),
            messages: vec![Message::user(job.text.clone())],
            tools: Vec::new(),
            max_tokens: INFER_MAX_TOKENS,
            temperature: Some(0.0),
            stream: false,
        };
        let answer = llm
            .chat(model.provider, &req, &mut |_| {})
            .await
            .map_err(|e| format!("the model call failed ({}): {}", e.wire_name(), e.message))?;
        let mut facts = parse_facts(&answer.text)?;
        let cut = facts.len() > MAX_INFER_FACTS;
        facts.truncate(MAX_INFER_FACTS);
        let scope = sandbox.map_or(Scope::Owner, Scope::Sandbox);
        for fact in facts {
            let text = MemoryText::new(fact).map_err(|e| format!("a fact the model gave: {e}"))?;
            let req = AddMemory {
                text,
                category: Some(
                    sandcell_api::memories::Category::new(job.category.clone())
                        .map_err(|e| e.to_string())?,
                ),
                metadata: Tags::new(job.metadata.clone()).map_err(|e| e.to_string())?,
            };
            let made = self
                .add_memory(caller, scope, req)
                .await
                .map_err(|e| format!("adding a fact: {}: {}", e.code(), e.message))?;
            added.push(made.id);
            // Progress is visible while it goes.
            let _ = self.store.update_memory_job(
                &job.id,
                InferStatus::Running.as_str(),
                added,
                None,
                now_ms(),
            );
        }
        if cut {
            tracing::info!(job = %job.id, "the model gave more than {MAX_INFER_FACTS} facts: the rest were left out");
        }
        Ok(())
    }

    /// The job record as it stands: one left `queued` or `running` by a process that is no
    /// longer running it is marked failed (`interrupted`) first.
    fn settled_job(&self, mut j: MemoryJobRecord) -> ServiceResult<MemoryJobRecord> {
        let open = InferStatus::parse(&j.status).is_some_and(|s| !s.is_done());
        if !open {
            return Ok(j);
        }
        let running_here = j.worker == self.memory.worker && self.memory.live().contains(&j.id);
        let elsewhere = j.worker != self.memory.worker && worker_alive(&j.worker);
        if running_here || elsewhere {
            return Ok(j);
        }
        let error = "interrupted: the process running this job stopped before it finished";
        let at = now_ms();
        if self.store.update_memory_job(
            &j.id,
            InferStatus::Failed.as_str(),
            &j.memories,
            Some(error),
            at,
        )? {
            j.status = InferStatus::Failed.as_str().to_string();
            j.error = Some(error.to_string());
            j.updated_at = at;
            Ok(j)
        } else {
            // It ended meanwhile: its own record says how.
            self.store
                .get_memory_job(&j.id)?
                .ok_or_else(|| ServiceError::not_found("memory job", &j.id))
        }
    }

    /// One infer job of the caller's (see [`Scope`] for which).
    pub fn get_infer_job(
        &self,
        caller: &Caller,
        scope: Scope<'_>,
        id: &str,
    ) -> ServiceResult<InferJob> {
        check_record_id(id, INFER_JOB_ID_PREFIX, "a memory job")?;
        let sandbox = self.memory_sandbox(caller, scope)?;
        let job = self
            .store
            .get_memory_job(id)?
            .filter(|j| j.owner == caller.owner)
            .filter(|j| match sandbox {
                Some(sb) => j.sandbox_id.as_deref() == Some(sb.as_str()),
                None => true,
            })
            .ok_or_else(|| ServiceError::not_found("memory job", id))?;
        Ok(infer_job_info(&self.settled_job(job)?))
    }

    /// A page of the infer jobs of `scope`, newest first.
    pub fn list_infer_jobs(
        &self,
        caller: &Caller,
        scope: Scope<'_>,
        req: ListInferJobs,
    ) -> ServiceResult<InferJobList> {
        let limit = limit(req.limit, DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)?;
        let before = cursor(req.cursor.as_deref())?;
        let sandbox = self.memory_sandbox(caller, scope)?;
        let page = self.store.list_memory_jobs(
            &caller.owner,
            sandbox.map(|s| s.as_str()),
            limit,
            before,
        )?;
        Ok(InferJobList {
            jobs: page
                .items
                .into_iter()
                .map(|j| self.settled_job(j).map(|j| infer_job_info(&j)))
                .collect::<ServiceResult<_>>()?,
            next_cursor: page.next_cursor,
        })
    }

    /// Waits until infer job `id` has ended (polling the store), at most `timeout`; the job
    /// as it then is (still open when the time ran out).
    pub async fn wait_infer_job(
        &self,
        caller: &Caller,
        scope: Scope<'_>,
        id: &str,
        timeout: Duration,
    ) -> ServiceResult<InferJob> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let job = self.get_infer_job(caller, scope, id)?;
            if job.status.is_done() || tokio::time::Instant::now() >= deadline {
                return Ok(job);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Gives sandbox `sandbox_id`, just made from `snapshot`, the memories the snapshot's
    /// sandbox had when it was taken (copies with ids of their own, their original times
    /// and their vectors); all or none. How many.
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
                    // The original's, whose vector the copy takes.
                    seq: m.seq,
                    id: new_record_id(MEMORY_ID_PREFIX)?,
                    sandbox_id: Some(sandbox_id.to_string()),
                    ..m
                })
            })
            .collect::<ServiceResult<Vec<_>>>()?;
        self.store.copy_memories(&copies)?;
        Ok(copies.len())
    }
}

/// Full-text hits as a search's answer.
fn fts_list(hits: Vec<sandcell_store::MemoryHit>, warning: Option<String>) -> MemoryList {
    MemoryList {
        memories: hits
            .iter()
            .map(|h| {
                let mut m = memory_info(&h.memory, Some(h.score));
                m.matched_by = Some(MatchedBy::Fts);
                m
            })
            .collect(),
        next_cursor: None,
        ranking: Some(Ranking::Fts),
        warning,
    }
}

/// The full-text ranking when the embeddings endpoint failed, saying so.
fn fts_fallback(mut hits: Vec<sandcell_store::MemoryHit>, limit: u32, why: &str) -> MemoryList {
    tracing::warn!(error = %why, "a memory search fell back to full-text ranking");
    hits.truncate(limit as usize);
    fts_list(
        hits,
        Some(format!(
            "ranked by words only: the embeddings endpoint failed ({why})"
        )),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use sandcell_api::memories::{Category, MemoryQuery};
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

    /// Runs a future to its end (the operations here await nothing but the model server).
    fn block<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn add(s: &Service, c: &Caller, scope: Scope<'_>, text: &str) -> Memory {
        block(s.add_memory(c, scope, AddMemory::text(MemoryText::new(text).unwrap()))).unwrap()
    }

    fn search(s: &Service, c: &Caller, scope: Scope<'_>, q: &str) -> Vec<String> {
        block(s.search_memories(c, scope, SearchMemories::new(MemoryQuery::new(q).unwrap())))
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
            block(s.add_memory(
                &bob,
                Scope::Sandbox(&sb),
                AddMemory::text(MemoryText::new("mine now").unwrap()),
            ))
            .unwrap_err(),
            block(s.search_memories(
                &bob,
                Scope::Sandbox(&sb),
                SearchMemories::new(MemoryQuery::new("deploy").unwrap()),
            ))
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
            block(s.add_memory(&alice, Scope::Owner, req)).unwrap();
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
        let err = block(s.search_memories(&alice, Scope::Owner, req)).unwrap_err();
        assert!(err.message.contains("'limit'"), "{err}");
        let mut req = SearchMemories::new(MemoryQuery::new("note").unwrap());
        req.limit = Some(2);
        let found = block(s.search_memories(&alice, Scope::Owner, req)).unwrap();
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

    /// A service over `flags` (settings), in an `Arc` (infer jobs need one).
    fn service_with(flags: &[(&str, String)]) -> (tempfile::TempDir, Arc<Service>) {
        let home = tempfile::tempdir().unwrap();
        let flags: Vec<(String, String)> = flags
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let (config, _) = crate::config::load(home.path(), None, &[], &flags).unwrap();
        let store = Arc::new(Store::open(&config.database).unwrap());
        let fleet = Arc::new(Fleet::new(
            Engine::builder().build(),
            Arc::new(StoreLedger::new(store.clone())),
            config.fleet_limits(),
        ));
        let signer = UrlSigner::load_or_create(home.path()).unwrap();
        (home, Arc::new(Service::new(fleet, store, config, signer)))
    }

    fn query(q: &str) -> SearchMemories {
        SearchMemories::new(MemoryQuery::new(q).unwrap())
    }

    fn text(t: &str) -> AddMemory {
        AddMemory::text(MemoryText::new(t).unwrap())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hybrid_search_finds_by_meaning_and_falls_back_to_words_saying_so() {
        use sandcell_testkit::llm::{EmbeddingsScript, Fault, Script, ScriptedLlm};
        let llm = ScriptedLlm::start(
            Script::new().embeddings(EmbeddingsScript::default().synonyms([
                "automobile",
                "car",
                "vehicle",
            ])),
        )
        .await
        .unwrap();
        let (_home, s) = service_with(&[
            ("agent.openai.base_url", llm.openai_base()),
            ("memory.embedding_model", "openai/test-embed".to_string()),
        ]);
        let alice = caller("alice");
        let car = s
            .add_memory(&alice, Scope::Owner, text("The automobile needs new tyres"))
            .await
            .unwrap();
        assert_eq!(car.warning, None);
        s.add_memory(&alice, Scope::Owner, text("Lunch is at noon on Fridays"))
            .await
            .unwrap();
        let seq = |id: &str| s.store.get_memory(id).unwrap().unwrap().seq;
        let v = s.store.memory_vector(seq(&car.id)).unwrap().unwrap();
        assert_eq!(
            (v.model.as_str(), v.vector.len()),
            ("openai/test-embed", 64)
        );

        // No word in common: words alone find nothing, the embedding finds it.
        let hits = s
            .search_memories(&alice, Scope::Owner, query("vehicle"))
            .await
            .unwrap();
        assert_eq!(hits.ranking, Some(Ranking::Hybrid));
        assert_eq!(hits.warning, None);
        assert_eq!(hits.memories.len(), 1, "{hits:?}");
        assert_eq!(hits.memories[0].id, car.id);
        assert_eq!(hits.memories[0].matched_by, Some(MatchedBy::Semantic));
        assert!(hits.memories[0].similarity.unwrap() > 0.3);
        // Words and meaning: both.
        let hits = s
            .search_memories(&alice, Scope::Owner, query("new tyres"))
            .await
            .unwrap();
        assert_eq!(hits.memories[0].matched_by, Some(MatchedBy::Both));
        let body = llm.requests().last().unwrap().body.clone();
        assert_eq!(body["input"], serde_json::json!(["new tyres"]));

        // The endpoint fails: the add keeps the memory (saying so), the search says fts.
        llm.set_embeddings_fault(Some(Fault::status(500, "embedder down")));
        let later = s
            .add_memory(
                &alice,
                Scope::Owner,
                text("The car is parked in the garage"),
            )
            .await
            .unwrap();
        assert!(
            later.warning.as_deref().unwrap().contains("embedder down"),
            "{later:?}"
        );
        assert!(s.store.memory_vector(seq(&later.id)).unwrap().is_none());
        let hits = s
            .search_memories(&alice, Scope::Owner, query("vehicle garage"))
            .await
            .unwrap();
        assert_eq!(hits.ranking, Some(Ranking::Fts));
        assert!(
            hits.warning
                .as_deref()
                .unwrap()
                .contains("embeddings endpoint failed"),
            "{hits:?}"
        );
        assert_eq!(hits.memories.len(), 1);
        assert_eq!(
            (hits.memories[0].id.as_str(), hits.memories[0].matched_by),
            (later.id.as_str(), Some(MatchedBy::Fts))
        );
        llm.set_embeddings_fault(Some(Fault::Unauthorized));
        let hits = s
            .search_memories(&alice, Scope::Owner, query("vehicle"))
            .await
            .unwrap();
        assert_eq!(hits.ranking, Some(Ranking::Fts));
        assert!(hits.memories.is_empty());

        // Back: the next search embeds what was stored without a vector.
        llm.set_embeddings_fault(None);
        let hits = s
            .search_memories(&alice, Scope::Owner, query("vehicle"))
            .await
            .unwrap();
        assert_eq!(hits.ranking, Some(Ranking::Hybrid));
        let mut found: Vec<&str> = hits.memories.iter().map(|m| m.id.as_str()).collect();
        found.sort_unstable();
        let mut want = vec![car.id.as_str(), later.id.as_str()];
        want.sort_unstable();
        assert_eq!(found, want);
        assert!(s.store.memory_vector(seq(&later.id)).unwrap().is_some());
    }

    #[test]
    fn facts_come_from_a_json_list_and_anything_else_is_refused() {
        assert_eq!(parse_facts(r#"["a", " b ", "", "a"]"#).unwrap(), ["a", "b"]);
        assert_eq!(parse_facts("```json\n[\"x\"]\n```").unwrap(), ["x"]);
        assert_eq!(parse_facts(r#"{"facts": ["y"]}"#).unwrap(), ["y"]);
        assert!(parse_facts("[]").unwrap().is_empty());
        for bad in ["Sure! The facts are: x", "[1, 2]", r#"{"a": 1}"#, "\"x\""] {
            let e = parse_facts(bad).unwrap_err();
            assert!(e.contains("not a JSON list of strings"), "{e}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn infer_jobs_add_the_models_facts_fail_on_bad_output_and_need_a_model() {
        use sandcell_testkit::llm::{Script, ScriptedLlm, Turn};
        let llm = ScriptedLlm::start(Script::new().turns([
            Turn::text(r#"["The user lives in Lisbon", "The user drinks green tea"]"#),
            Turn::text("Here are some facts: the user lives in Lisbon."),
        ]))
        .await
        .unwrap();
        let (_home, s) = service_with(&[
            ("agent.openai.base_url", llm.openai_base()),
            ("agent.model", "openai/test-model".to_string()),
        ]);
        let alice = caller("alice");
        let sb = sandbox(&s, "sb-alice", "alice");
        let mut req =
            InferMemories::text(MemoryText::new("I moved to Lisbon; I drink green tea.").unwrap());
        req.category = Some(Category::new("profile").unwrap());
        req.metadata = Tags::new(BTreeMap::from([("by".to_string(), "test".to_string())])).unwrap();
        let job = s
            .infer_memories(&alice, Scope::Sandbox(&sb), req)
            .await
            .unwrap();
        assert_eq!(job.status, InferStatus::Queued);
        assert!(job.id.starts_with("inf-") && job.memories.is_empty());
        let done = s
            .wait_infer_job(
                &alice,
                Scope::Sandbox(&sb),
                &job.id,
                Duration::from_secs(20),
            )
            .await
            .unwrap();
        assert_eq!(done.status, InferStatus::Succeeded, "{done:?}");
        assert_eq!(done.memories.len(), 2);
        let m = s
            .get_memory(&alice, Scope::Owner, &done.memories[0])
            .unwrap();
        assert_eq!(
            (
                m.text.as_str(),
                m.category.as_str(),
                m.sandbox_id.as_deref()
            ),
            ("The user lives in Lisbon", "profile", Some("sb-alice"))
        );
        assert_eq!(
            (m.metadata["source"].as_str(), m.metadata["by"].as_str()),
            ("infer", "test")
        );
        let hits = s
            .search_memories(&alice, Scope::Sandbox(&sb), query("green tea"))
            .await
            .unwrap();
        assert_eq!(hits.memories[0].id, done.memories[1]);
        // The model was asked in the protocol's words, with the text.
        let asked = &llm.requests()[0];
        assert_eq!(asked.body["model"], "test-model");
        assert!(asked.body.to_string().contains("I moved to Lisbon"));

        // Output that is not a JSON list: failed, saying so.
        let job = s
            .infer_memories(
                &alice,
                Scope::Owner,
                InferMemories::text(MemoryText::new("more").unwrap()),
            )
            .await
            .unwrap();
        let done = s
            .wait_infer_job(&alice, Scope::Owner, &job.id, Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(done.status, InferStatus::Failed);
        assert!(
            done.error
                .as_deref()
                .unwrap()
                .contains("not a JSON list of strings"),
            "{done:?}"
        );
        assert!(done.memories.is_empty());
        // Listed newest first; another owner sees none; by id only in its scope.
        let jobs = s
            .list_infer_jobs(&alice, Scope::Owner, ListInferJobs::default())
            .unwrap();
        assert_eq!(jobs.jobs.len(), 1);
        assert_eq!(
            s.list_infer_jobs(&alice, Scope::Sandbox(&sb), ListInferJobs::default())
                .unwrap()
                .jobs
                .len(),
            1
        );
        let err = s
            .get_infer_job(&caller("bob"), Scope::Owner, &job.id)
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotFound);
        let err = s.get_infer_job(&alice, Scope::Owner, "inf-x").unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);

        // A job left open by a process that is gone (or by this one, not running it) reads
        // as failed, interrupted.
        for worker in ["1:0".to_string(), s.memory.worker.clone()] {
            let id = new_record_id(INFER_JOB_ID_PREFIX).unwrap();
            s.store
                .insert_memory_job(&MemoryJobRecord {
                    seq: 0,
                    id: id.clone(),
                    owner: "alice".into(),
                    sandbox_id: None,
                    status: "running".into(),
                    model: "openai/test-model".into(),
                    text: "t".into(),
                    category: "general".into(),
                    metadata: BTreeMap::new(),
                    memories: Vec::new(),
                    error: None,
                    worker,
                    created_at: 1,
                    updated_at: 1,
                })
                .unwrap();
            let j = s.get_infer_job(&alice, Scope::Owner, &id).unwrap();
            assert_eq!(j.status, InferStatus::Failed);
            assert!(j.error.unwrap().starts_with("interrupted"));
        }

        // No model: refused at once.
        let (_home2, none) = service_with(&[]);
        let err = none
            .infer_memories(
                &alice,
                Scope::Owner,
                InferMemories::text(MemoryText::new("x").unwrap()),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains("memory.infer_model"), "{err}");
        assert!(
            none.list_infer_jobs(&alice, Scope::Owner, ListInferJobs::default())
                .unwrap()
                .jobs
                .is_empty()
        );
    }
}
