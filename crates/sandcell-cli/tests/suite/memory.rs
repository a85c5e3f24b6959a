//! Memories end to end: over real HTTP on a real daemon (ranked search, owners kept apart,
//! a fork and a restore seeing their origin's memories as they were at the snapshot, bad
//! input refused naming the field), and `sandcell memory` through that daemon and, without
//! one, on a home's store in its own process. Hybrid search and infer jobs against the test
//! kit's scripted model on loopback: a memory sharing no word with the query found by its
//! embedding, the embeddings endpoint failing (the add kept, the search saying `fts`),
//! infer jobs succeeding, failing on bad output, refused without a model, and interrupted by
//! a daemon's death.

use std::process::{Command, Output};

use reqwest::Method;
use serde_json::{Value, json};

use std::time::Duration;

use sandcell_testkit::llm::{EmbeddingsScript, Fault, Script, Turn};

use super::common::BIN;
use super::daemon::{Daemon, Resp, wait_for};
use super::runs_api::Model;

/// Adds a memory to sandbox `sb` (or the admin's own with `None`); its id.
fn add(d: &Daemon, sb: Option<&str>, body: Value) -> String {
    let path = match sb {
        Some(id) => format!("/v1/sandboxes/{id}/memories"),
        None => "/v1/memories".to_string(),
    };
    let r = d.post(&path, body);
    assert_eq!(r.status, 201, "{}", r.body);
    r.body["id"].as_str().unwrap().to_string()
}

/// The texts of a memory list, in its order.
fn texts(r: &Resp) -> Vec<String> {
    assert_eq!(r.status, 200, "{}", r.body);
    r.body["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap().to_string())
        .collect()
}

fn search(d: &Daemon, sb: &str, q: &str) -> Resp {
    d.get(&format!(
        "/v1/sandboxes/{sb}/memories/search?q={}",
        q.replace(' ', "+").replace('?', "%3F")
    ))
}

const FIVE: [&str; 5] = [
    "The user prefers dark mode in every editor",
    "Deploys go out on Tuesdays after the standup",
    "The staging database is PostgreSQL 16 on port 5433",
    "The user's favourite colour is teal",
    "Blue-green deploys keep the previous release warm",
];

#[test]
fn memory_search_owners_forks_and_bad_input_over_http() {
    let d = Daemon::start(&[]);
    let sb = d.create_id(json!({}));
    let ids: Vec<String> = FIVE
        .iter()
        .map(|t| {
            add(
                &d,
                Some(&sb),
                json!({"text": t, "metadata": {"source": "test"}}),
            )
        })
        .collect();

    // Ranked: the relevant memory first, with a score; the others after it, if at all.
    let r = search(&d, &sb, "which port does the staging database use?");
    assert_eq!(r.body["memories"][0]["id"], ids[2].as_str(), "{}", r.body);
    let scores: Vec<f64> = r.body["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["score"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    let r = search(&d, &sb, "favourite colour");
    assert_eq!(texts(&r), [FIVE[3]]);
    // Search syntax is not syntax.
    for q in ["\"deploys", "deploys OR", "NEAR(deploys", "deploys*"] {
        let r = d.get(&format!(
            "/v1/sandboxes/{sb}/memories/search?q={}",
            q.replace('"', "%22").replace(' ', "+").replace('(', "%28")
        ));
        assert_eq!(r.status, 200, "{q}: {}", r.body);
        assert_eq!(
            r.body["memories"].as_array().unwrap().len(),
            2,
            "{q}: {}",
            r.body
        );
    }
    // The sandbox's memories are not the owner's.
    let own = add(
        &d,
        None,
        json!({"text": "the admin writes British English", "category": "style"}),
    );
    assert!(texts(&search(&d, &sb, "british english")).is_empty());
    let r = d.get("/v1/memories/search?q=british&category=style");
    assert_eq!(r.body["memories"][0]["id"], own.as_str(), "{}", r.body);

    // Another owner's key: everything is missing, never forbidden.
    let (bob, _) = d.key_for("bob");
    for (method, path) in [
        (Method::GET, format!("/v1/sandboxes/{sb}/memories")),
        (
            Method::GET,
            format!("/v1/sandboxes/{sb}/memories/search?q=deploys"),
        ),
        (
            Method::GET,
            format!("/v1/sandboxes/{sb}/memories/{}", ids[0]),
        ),
        (
            Method::DELETE,
            format!("/v1/sandboxes/{sb}/memories/{}", ids[0]),
        ),
        (Method::GET, format!("/v1/memories/{own}")),
        (Method::DELETE, format!("/v1/memories/{own}")),
        (Method::GET, format!("/v1/memories/{}", ids[0])),
    ] {
        d.call_as(Some(&bob), method.clone(), &path, None)
            .expect_error(404, "not_found");
    }
    let r = d.call_as(
        Some(&bob),
        Method::POST,
        &format!("/v1/sandboxes/{sb}/memories"),
        Some(json!({"text": "bob was here"})),
    );
    r.expect_error(404, "not_found");
    let r = d.call_as(
        Some(&bob),
        Method::GET,
        "/v1/memories/search?q=british",
        None,
    );
    assert!(texts(&r).is_empty());
    // Nothing of bob's landed anywhere.
    assert_eq!(
        texts(&d.get(&format!("/v1/sandboxes/{sb}/memories"))).len(),
        5
    );

    // A snapshot, then a memory added after it and one from before it deleted.
    let r = d.post(&format!("/v1/sandboxes/{sb}/snapshots"), json!({}));
    assert_eq!(r.status, 201, "{}", r.body);
    let snap = r.body["id"].as_str().unwrap().to_string();
    std::thread::sleep(std::time::Duration::from_millis(5));
    add(
        &d,
        Some(&sb),
        json!({"text": "Added after the snapshot: deploys moved to Fridays"}),
    );
    let r = d.delete(&format!("/v1/sandboxes/{sb}/memories/{}", ids[1]));
    assert_eq!(r.status, 204, "{}", r.body);
    let mut now = texts(&d.get(&format!("/v1/sandboxes/{sb}/memories")));
    now.sort();
    assert!(now.iter().any(|t| t.starts_with("Added after")), "{now:?}");
    assert!(!now.iter().any(|t| t == FIVE[1]), "{now:?}");

    // A fork and a restore see the five as they were, not the later one.
    let r = d.post(&format!("/v1/snapshots/{snap}/fork"), json!({"count": 1}));
    assert_eq!(r.status, 201, "{}", r.body);
    let forked = r.body["sandboxes"][0]["sandbox"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let restored = d.create_id(json!({"snapshot_id": snap}));
    for new in [&forked, &restored] {
        let r = d.get(&format!("/v1/sandboxes/{new}/memories"));
        let mut seen = texts(&r);
        seen.sort();
        let mut want: Vec<String> = FIVE.iter().map(|t| t.to_string()).collect();
        want.sort();
        assert_eq!(seen, want, "{new}");
        for m in r.body["memories"].as_array().unwrap() {
            assert_eq!(m["sandbox_id"], new.as_str(), "{m}");
            assert_eq!(m["metadata"]["source"], "test", "{m}");
            assert!(!ids.contains(&m["id"].as_str().unwrap().to_string()), "{m}");
        }
        assert!(texts(&search(&d, new, "fridays")).is_empty(), "{new}");
        let r = search(&d, new, "when do deploys go out");
        assert_eq!(texts(&r)[0], FIVE[1], "{new}: {}", r.body);
    }
    // The fork's memories are its own: adding to it leaves the origin alone.
    add(
        &d,
        Some(&forked),
        json!({"text": "only the fork knows this"}),
    );
    assert!(texts(&search(&d, &sb, "only fork knows")).is_empty());

    // Bad input: a 400 naming the field.
    let path = format!("/v1/sandboxes/{sb}/memories");
    for (body, field) in [
        (json!({"text": ""}), "text"),
        (json!({"text": "x".repeat(64 * 1024 + 1)}), "text"),
        (
            json!({"text": "a", "category": "Bad Category!"}),
            "category",
        ),
        (json!({"text": "a", "shape": "round"}), "shape"),
    ] {
        let r = d.post(&path, body);
        r.expect_error(400, "invalid_argument");
        let message = r.body["message"].as_str().unwrap();
        assert!(message.contains(field), "{message}");
    }
    for (query, field) in [("", "q"), ("?q=+", "q"), ("?q=a&limit=500", "limit")] {
        let r = d.get(&format!("/v1/sandboxes/{sb}/memories/search{query}"));
        r.expect_error(400, "invalid_argument");
        assert!(
            r.body["message"].as_str().unwrap().contains(field),
            "{}",
            r.body
        );
    }
    d.get(&format!("/v1/sandboxes/{sb}/memories/mem-nothing"))
        .expect_error(400, "invalid_argument");
}

/// `sandcell ARGS --home HOME` with no daemon named by the environment.
fn sandcell(home: &std::path::Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--home")
        .arg(home)
        .env_remove("SANDCELL_API_URL")
        .env_remove("SANDCELL_API_KEY")
        .env_remove("SANDCELL_HOME")
        .output()
        .unwrap()
}

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn memory_cli_round_trips_through_the_daemon_and_without_one() {
    let d = Daemon::start(&[]);
    let sb = d.create_id(json!({}));
    let home = d.home();
    for text in FIVE {
        json_of(&sandcell(
            home,
            &["memory", "add", "--sandbox", &sb, "--json", text],
        ));
    }
    let added = json_of(&sandcell(
        home,
        &[
            "memory",
            "add",
            "--sandbox",
            &sb,
            "--category",
            "infra",
            "--meta",
            "by=cli",
            "--json",
            "The CI runners are in eu-west-1",
        ],
    ));
    let id = added["id"].as_str().unwrap().to_string();
    assert_eq!(
        (
            &added["scope"],
            &added["sandbox_id"],
            &added["category"],
            &added["metadata"]["by"]
        ),
        (
            &json!("sandbox"),
            &json!(sb),
            &json!("infra"),
            &json!("cli")
        )
    );
    // Through the daemon: the daemon has it.
    let r = d.get(&format!("/v1/sandboxes/{sb}/memories/{id}"));
    assert_eq!(r.status, 200, "{}", r.body);
    let found = json_of(&sandcell(
        home,
        &[
            "memory",
            "search",
            "--sandbox",
            &sb,
            "--json",
            "where are the CI runners?",
        ],
    ));
    assert_eq!(found["memories"][0]["id"], id.as_str(), "{found}");
    let only = json_of(&sandcell(
        home,
        &[
            "memory",
            "search",
            "--sandbox",
            &sb,
            "--category",
            "infra",
            "--json",
            "the",
        ],
    ));
    assert_eq!(only["memories"].as_array().unwrap().len(), 1, "{only}");
    let listed = json_of(&sandcell(
        home,
        &["memory", "list", "--sandbox", &sb, "--json"],
    ));
    assert_eq!(listed["memories"].as_array().unwrap().len(), 6, "{listed}");
    assert_eq!(
        listed["memories"][0]["id"],
        id.as_str(),
        "newest first: {listed}"
    );
    // Text output: a table with the id.
    let out = sandcell(home, &["memory", "search", "--sandbox", &sb, "runners"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(&id));
    // Deleted through the CLI: gone from the daemon.
    let gone = json_of(&sandcell(
        home,
        &["memory", "delete", "--sandbox", &sb, "--json", &id],
    ));
    assert_eq!(gone["deleted"], json!([id]));
    d.get(&format!("/v1/sandboxes/{sb}/memories/{id}"))
        .expect_error(404, "not_found");
    // A bad category never reaches the daemon; a missing memory is an error.
    let out = sandcell(home, &["memory", "add", "--category", "No!", "x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("category"));
    let out = sandcell(home, &["memory", "delete", &id]);
    assert!(!out.status.success());

    // Without a daemon: the same commands on a home's store, in the command's process.
    let alone = tempfile::tempdir().unwrap();
    let home = alone.path();
    let added = json_of(&sandcell(
        home,
        &[
            "memory",
            "add",
            "--json",
            "The user's timezone is Europe/Lisbon",
        ],
    ));
    assert_eq!(added["scope"], "owner", "{added}");
    json_of(&sandcell(
        home,
        &["memory", "add", "--json", "The user drinks green tea"],
    ));
    let found = json_of(&sandcell(
        home,
        &["memory", "search", "--json", "what timezone?"],
    ));
    assert_eq!(found["memories"][0]["id"], added["id"], "{found}");
    let shown = json_of(&sandcell(
        home,
        &["memory", "show", "--json", added["id"].as_str().unwrap()],
    ));
    assert_eq!(shown["text"], "The user's timezone is Europe/Lisbon");
    // A sandbox this home never had is missing.
    let out = sandcell(
        home,
        &[
            "memory",
            "list",
            "--sandbox",
            "sb-0000000000000000",
            "--json",
        ],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("sb-0000000000000000"));
}

/// The scripted model with its embeddings' synonym group (automobile, car, vehicle).
fn embedder(turns: Vec<Turn>) -> Model {
    Model::start(
        Script::new()
            .turns(turns)
            .embeddings(EmbeddingsScript::default().synonyms(["automobile", "car", "vehicle"])),
    )
}

/// The `input` of the last embeddings request the model received.
fn last_embedded(m: &Model) -> Value {
    m.llm
        .requests()
        .iter()
        .rev()
        .find(|r| r.path == "/v1/embeddings")
        .map(|r| r.body["input"].clone())
        .unwrap_or(Value::Null)
}

#[test]
fn hybrid_search_finds_by_meaning_and_falls_back_to_words_saying_so() {
    let model = embedder(Vec::new());
    let d = Daemon::start(&[
        &format!("agent.openai.base_url={}", model.llm.openai_base()),
        "memory.embedding_model=openai/test-embed",
    ]);
    let sb = d.create_id(json!({}));
    let car = add(
        &d,
        Some(&sb),
        json!({"text": "The automobile needs new tyres"}),
    );
    add(
        &d,
        Some(&sb),
        json!({"text": "Lunch is at noon on Fridays"}),
    );
    add(
        &d,
        Some(&sb),
        json!({"text": "The staging database is PostgreSQL"}),
    );

    // "vehicle" shares no word with any memory: full-text alone finds nothing; the
    // embedding finds the automobile, and says so.
    let r = search(&d, &sb, "vehicle");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["ranking"], "hybrid", "{}", r.body);
    assert!(r.body.get("warning").is_none(), "{}", r.body);
    let hits = r.body["memories"].as_array().unwrap();
    assert_eq!(hits.len(), 1, "{}", r.body);
    assert_eq!(hits[0]["id"], car.as_str());
    assert_eq!(hits[0]["matched_by"], "semantic");
    assert!(hits[0]["similarity"].as_f64().unwrap() > 0.3, "{}", r.body);
    // Words and meaning together rank first.
    let r = search(&d, &sb, "when is lunch");
    assert_eq!(r.body["memories"][0]["matched_by"], "both", "{}", r.body);

    // A fork carries the vectors: its search embeds only the query.
    let snap = d.post(&format!("/v1/sandboxes/{sb}/snapshots"), json!({}));
    assert_eq!(snap.status, 201, "{}", snap.body);
    let r = d.post(
        &format!("/v1/snapshots/{}/fork", snap.body["id"].as_str().unwrap()),
        json!({"count": 1}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let fork = r.body["sandboxes"][0]["sandbox"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = search(&d, &fork, "vehicle");
    assert_eq!(texts(&r), ["The automobile needs new tyres"]);
    assert_eq!(last_embedded(&model), json!(["vehicle"]));

    // The embeddings endpoint fails: the add keeps the memory and says so; the search ranks
    // by words and says so.
    model
        .llm
        .set_embeddings_fault(Some(Fault::status(500, "embedder down")));
    let r = d.post(
        &format!("/v1/sandboxes/{sb}/memories"),
        json!({"text": "The car is parked in the garage"}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let parked = r.body["id"].as_str().unwrap().to_string();
    assert!(
        r.body["warning"]
            .as_str()
            .unwrap()
            .contains("embedder down"),
        "{}",
        r.body
    );
    let r = search(&d, &sb, "vehicle garage");
    assert_eq!(r.body["ranking"], "fts", "{}", r.body);
    assert!(
        r.body["warning"]
            .as_str()
            .unwrap()
            .contains("embeddings endpoint failed"),
        "{}",
        r.body
    );
    assert_eq!(texts(&r), ["The car is parked in the garage"]);
    assert_eq!(r.body["memories"][0]["matched_by"], "fts");
    model.llm.set_embeddings_fault(Some(Fault::Unauthorized));
    let r = search(&d, &sb, "vehicle");
    assert_eq!(
        (r.status, &r.body["ranking"]),
        (200, &json!("fts")),
        "{}",
        r.body
    );
    assert!(texts(&r).is_empty());
    // The CLI says how it ranked.
    let out = sandcell(d.home(), &["memory", "search", "--sandbox", &sb, "garage"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ranking: fts") && err.contains("warning:"),
        "{err}"
    );

    // Back: the next search embeds the memory stored without a vector, and finds it.
    model.llm.set_embeddings_fault(None);
    let r = search(&d, &sb, "vehicle");
    assert_eq!(r.body["ranking"], "hybrid", "{}", r.body);
    let mut found: Vec<String> = ids_of(&r);
    found.sort();
    let mut want = vec![car.clone(), parked.clone()];
    want.sort();
    assert_eq!(found, want, "{}", r.body);
    assert_eq!(
        last_embedded(&model),
        json!(["vehicle", "The car is parked in the garage"])
    );
    let out = sandcell(d.home(), &["memory", "search", "--sandbox", &sb, "vehicle"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(stderr.contains("ranking: hybrid"), "{stderr}");
    assert!(
        stdout.contains("semantic") && stdout.contains(&car),
        "{stdout}"
    );

    // This daemon has no model to infer with: refused at once, no job made.
    let r = d.post("/v1/memories/infer", json!({"text": "I moved to Lisbon"}));
    r.expect_error(400, "invalid_argument");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("memory.infer_model"),
        "{}",
        r.body
    );
    let r = d.get("/v1/memories/infer");
    assert_eq!(r.body["jobs"], json!([]), "{}", r.body);
}

fn ids_of(r: &Resp) -> Vec<String> {
    r.body["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

/// Polls a job until `done` says so (at most 30 s); its last state.
fn job_until(d: &Daemon, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    wait_for(Duration::from_secs(30), || {
        let r = d.get(path);
        assert_eq!(r.status, 200, "{}", r.body);
        done(&r.body).then_some(r.body)
    })
    .unwrap_or_else(|| panic!("{path} did not get there: {}", d.get(path).body))
}

#[test]
fn infer_jobs_extract_facts_fail_on_bad_output_and_are_interrupted_by_a_stop() {
    let model = embedder(vec![
        Turn::text(r#"["The user lives in Lisbon", "The user drinks green tea"]"#),
        Turn::text("Sure! The user lives in Lisbon."),
        Turn::text(r#"["The CI runners are in eu-west-1"]"#),
        Turn::Fault(Fault::Slow {
            delay_ms: 60_000,
            then: Box::new(Turn::text("[]")),
        }),
    ]);
    let sets = [
        format!("agent.openai.base_url={}", model.llm.openai_base()),
        "agent.model=openai/test-model".to_string(),
    ];
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let mut d = Daemon::start(&sets);
    let sb = d.create_id(json!({}));

    // Accepted at once, then the model's facts become memories of the sandbox.
    let r = d.post(
        &format!("/v1/sandboxes/{sb}/memories/infer"),
        json!({"text": "I moved to Lisbon last year. I drink green tea.", "category": "profile", "metadata": {"by": "test"}}),
    );
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(
        (&r.body["status"], &r.body["sandbox_id"]),
        (&json!("queued"), &json!(sb))
    );
    let job = r.body["id"].as_str().unwrap().to_string();
    let done = job_until(
        &d,
        &format!("/v1/sandboxes/{sb}/memories/infer/{job}"),
        |j| j["status"] == "succeeded" || j["status"] == "failed",
    );
    assert_eq!(done["status"], "succeeded", "{done}");
    let added: Vec<String> = done["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    assert_eq!(added.len(), 2, "{done}");
    let m = d.get(&format!("/v1/sandboxes/{sb}/memories/{}", added[1]));
    assert_eq!(m.body["text"], "The user drinks green tea");
    assert_eq!(
        (&m.body["category"], &m.body["metadata"]),
        (&json!("profile"), &json!({"by": "test", "source": "infer"}))
    );
    let r = search(&d, &sb, "where does the user live");
    assert_eq!(ids_of(&r)[0], added[0], "{}", r.body);
    // The owner's route finds the sandbox's job by id too.
    assert_eq!(
        d.get(&format!("/v1/memories/infer/{job}")).body["id"],
        job.as_str()
    );

    // Output that is not a JSON list: the job fails, saying so; nothing is added.
    let r = d.post("/v1/memories/infer", json!({"text": "More about me."}));
    assert_eq!(r.status, 202, "{}", r.body);
    let bad = r.body["id"].as_str().unwrap().to_string();
    let failed = job_until(&d, &format!("/v1/memories/infer/{bad}"), |j| {
        j["status"] == "failed"
    });
    assert!(
        failed["error"]
            .as_str()
            .unwrap()
            .contains("not a JSON list of strings"),
        "{failed}"
    );
    assert_eq!(failed["memories"], json!([]));
    let listed = d.get("/v1/memories/infer");
    assert_eq!(
        listed.body["jobs"][0]["id"],
        bad.as_str(),
        "{}",
        listed.body
    );

    // The CLI: --infer --wait prints the job once it has ended.
    let out = sandcell(
        d.home(),
        &[
            "memory",
            "add",
            "--sandbox",
            &sb,
            "--infer",
            "--wait",
            "--json",
            "CI runs in Ireland",
        ],
    );
    let job_json = json_of(&out);
    assert_eq!(job_json["status"], "succeeded", "{job_json}");
    let m = d.get(&format!(
        "/v1/sandboxes/{sb}/memories/{}",
        job_json["memories"][0].as_str().unwrap()
    ));
    assert_eq!(m.body["text"], "The CI runners are in eu-west-1");
    let out = sandcell(
        d.home(),
        &[
            "memory",
            "infer-status",
            "--sandbox",
            &sb,
            "--json",
            job_json["id"].as_str().unwrap(),
        ],
    );
    assert_eq!(json_of(&out)["status"], "succeeded");

    // A job running when the daemon dies reads as failed, interrupted, after the restart.
    let r = d.post("/v1/memories/infer", json!({"text": "A slow one."}));
    let slow = r.body["id"].as_str().unwrap().to_string();
    job_until(&d, &format!("/v1/memories/infer/{slow}"), |j| {
        j["status"] == "running"
    });
    d.kill9();
    d.restart(&sets);
    let r = d.get(&format!("/v1/memories/infer/{slow}"));
    assert_eq!(r.body["status"], "failed", "{}", r.body);
    assert!(
        r.body["error"].as_str().unwrap().starts_with("interrupted"),
        "{}",
        r.body
    );
    // Bad ids are a 400, another owner's job a 404.
    d.get("/v1/memories/infer/inf-nope")
        .expect_error(400, "invalid_argument");
    let (bob, _) = d.key_for("bob");
    d.call_as(
        Some(&bob),
        Method::GET,
        &format!("/v1/memories/infer/{slow}"),
        None,
    )
    .expect_error(404, "not_found");
}
