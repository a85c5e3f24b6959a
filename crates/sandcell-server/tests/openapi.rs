//! The committed OpenAPI document (`docs/openapi.json`) is the API's contract for the SDKs
//! and for readers: this fails when the code's document differs from it. To update it after
//! a deliberate change: `SANDCELL_UPDATE_OPENAPI=1 cargo test -p sandcell-server --test openapi`.

use std::path::PathBuf;

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
}

fn generated() -> String {
    let doc = serde_json::to_value(sandcell_server::openapi()).expect("the document serializes");
    format!(
        "{}\n",
        serde_json::to_string_pretty(&doc).expect("the document prints")
    )
}

#[test]
fn the_committed_openapi_document_is_current() {
    let path = committed_path();
    let now = generated();
    if std::env::var_os("SANDCELL_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &now).expect("write docs/openapi.json");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != now {
        let first = committed
            .lines()
            .zip(now.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(now.lines().count()));
        panic!(
            "docs/openapi.json is stale (first difference at line {}: committed {:?}, code {:?}); \
             if the API change is deliberate, run \
             `SANDCELL_UPDATE_OPENAPI=1 cargo test -p sandcell-server --test openapi` and commit it",
            first + 1,
            committed.lines().nth(first).unwrap_or("<end>"),
            now.lines().nth(first).unwrap_or("<end>"),
        );
    }
}

#[test]
fn every_operation_has_a_unique_id_and_a_tag() {
    let doc = serde_json::to_value(sandcell_server::openapi()).expect("the document serializes");
    let mut ids = std::collections::HashSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            let id = op["operationId"].as_str().unwrap_or_default();
            assert!(!id.is_empty(), "{method} {path} has no operationId");
            assert!(ids.insert(id.to_string()), "operationId {id} is used twice");
            assert!(
                op["tags"].as_array().is_some_and(|t| !t.is_empty()),
                "{method} {path} has no tag"
            );
        }
    }
}
