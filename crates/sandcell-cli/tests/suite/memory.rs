//! Memories end to end: over real HTTP on a real daemon (ranked search, owners kept apart,
//! a fork and a restore seeing their origin's memories as they were at the snapshot, bad
//! input refused naming the field), and `sandcell memory` through that daemon and, without
//! one, on a home's store in its own process.

use std::process::{Command, Output};

use reqwest::Method;
use serde_json::{Value, json};

use super::common::BIN;
use super::daemon::{Daemon, Resp};

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
