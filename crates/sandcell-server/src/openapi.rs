//! Completes the OpenAPI document the handlers describe: the error answers any operation can
//! give (every one of them is `ErrorBody`), the shapes of path parameters, and links from each
//! operation that makes a resource to the operations that take its id, so that a client
//! generated from the document, or a fuzzer such as schemathesis (its stateful phase follows
//! the links), sees exactly what the service accepts and returns.

use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr, Schema};

/// Error statuses every operation may answer, with what they mean.
const ERRORS: &[(&str, &str)] = &[
    (
        "400",
        "Invalid request (malformed JSON, wrong types, unknown fields, bad ids or query parameters)",
    ),
    ("401", "No valid API key"),
    ("404", "No such resource for this key"),
    (
        "409",
        "The sandbox is not running, or the resource is in a conflicting state",
    ),
    ("413", "The body is over the size limit"),
    ("422", "The program could not be started"),
    ("429", "A cap was reached"),
    ("500", "The service failed"),
    ("504", "The sandbox's agent did not answer in time"),
    ("507", "The sandbox's disk is full"),
];

/// Shapes of the path parameters, by name: (pattern, or None for an integer ≥ 2).
const PATH_PARAMS: &[(&str, Option<&str>)] = &[
    ("id", Some("^sb-[a-z0-9-]{1,64}$")),
    ("export_id", Some("^ex-[0-9a-f]{16}$")),
    ("snapshot_id", Some("^sn-[0-9a-f]{16}$")),
    ("key_id", Some("^[0-9a-f]{1,64}$")),
    ("run_id", Some("^run-[0-9a-f]{16}$")),
    ("memory_id", Some("^mem-[0-9a-f]{16}$")),
    ("job_id", Some("^inf-[0-9a-f]{16}$")),
    ("context", Some("^[A-Za-z0-9_.-]{1,64}$")),
    ("build_id", Some("^bld-[0-9a-f]{12}$")),
    (
        "name",
        Some("^[a-z0-9][a-z0-9._-]{0,63}(:[a-z0-9][a-z0-9._-]{0,31})?$"),
    ),
    ("pid", None),
];

/// Operations that make a resource: (path of the `POST`, the path parameter its id fills in
/// later operations, the field of its `201` (or `202`: made, going on) body holding that id).
const PRODUCERS: &[(&str, &str, &str)] = &[
    ("/v1/sandboxes", "id", "id"),
    ("/v1/sandboxes/{id}/contexts", "context", "id"),
    ("/v1/sandboxes/{id}/processes", "pid", "pid"),
    ("/v1/sandboxes/{id}/exports", "export_id", "id"),
    ("/v1/sandboxes/{id}/snapshots", "snapshot_id", "id"),
    ("/v1/keys", "key_id", "id"),
    ("/v1/runs", "run_id", "id"),
    ("/v1/templates", "build_id", "id"),
    ("/v1/sandboxes/{id}/memories", "memory_id", "id"),
    ("/v1/memories", "memory_id", "id"),
    ("/v1/sandboxes/{id}/memories/infer", "job_id", "id"),
    ("/v1/memories/infer", "job_id", "id"),
];

/// Adds the error answers, parameter shapes and links to every operation, and makes the
/// operation ids unique.
pub fn complete(doc: &mut OpenApi) {
    add_links(doc);
    unique_operation_ids(doc);
    for op in operations(doc) {
        add_errors(op);
        shape_path_params(op);
    }
}

fn add_errors(op: &mut Operation) {
    let json_body = op.request_body.as_ref().is_some_and(|b| match b {
        RefOr::T(body) => body.content.contains_key("application/json"),
        RefOr::Ref(_) => true,
    });
    let mut statuses: Vec<(&str, &str)> = ERRORS.to_vec();
    if json_body {
        statuses.push(("415", "The body is not sent as application/json"));
    }
    for (status, description) in statuses {
        op.responses
            .responses
            .entry(status.to_string())
            .or_insert_with(|| {
                RefOr::T(
                    ResponseBuilder::new()
                        .description(description)
                        .content(
                            "application/json",
                            ContentBuilder::new()
                                .schema(Some(Ref::from_schema_name("ErrorBody")))
                                .build(),
                        )
                        .build(),
                )
            });
    }
}

fn shape_path_params(op: &mut Operation) {
    let Some(params) = op.parameters.as_mut() else {
        return;
    };
    for p in params.iter_mut() {
        let RefOr::T(p) = p else {
            continue;
        };
        if p.parameter_in != ParameterIn::Path {
            continue;
        }
        let Some((_, pattern)) = PATH_PARAMS.iter().find(|(name, _)| *name == p.name) else {
            continue;
        };
        let schema = match pattern {
            Some(pattern) => ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(*pattern))
                .build(),
            None => ObjectBuilder::new()
                .schema_type(Type::Integer)
                .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                    utoipa::openapi::KnownFormat::Int32,
                )))
                .minimum(Some(2))
                .build(),
        };
        p.schema = Some(RefOr::T(Schema::Object(schema)));
    }
}

/// The `{name}` parameters of a path template, in order.
fn path_params(path: &str) -> Vec<&str> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .collect()
}

/// Links each producer's `201` (or `202`) answer to every operation whose path parameters it
/// can fill: the new id from the answer, the others from the producer's own path.
fn add_links(doc: &mut OpenApi) {
    let mut targets: Vec<(String, &'static str)> = Vec::new();
    for (path, item) in &doc.paths.paths {
        for (method, op) in [
            ("get", &item.get),
            ("put", &item.put),
            ("post", &item.post),
            ("delete", &item.delete),
            ("patch", &item.patch),
        ] {
            if op.is_some() {
                targets.push((path.clone(), method));
            }
        }
    }
    for (producer, made, field) in PRODUCERS {
        let known = path_params(producer);
        let Some(response) = doc
            .paths
            .paths
            .get_mut(*producer)
            .and_then(|item| item.post.as_mut())
            .and_then(|op| {
                let answers = &mut op.responses.responses;
                let made = if answers.contains_key("201") {
                    "201"
                } else {
                    "202"
                };
                answers.get_mut(made)
            })
        else {
            continue;
        };
        let RefOr::T(response) = response else {
            continue;
        };
        for (path, method) in &targets {
            let params = path_params(path);
            if !params.contains(made) || !params.iter().all(|p| p == made || known.contains(p)) {
                continue;
            }
            let mut link = LinkBuilder::new()
                .operation_ref(format!("#/paths/{}/{method}", pointer(path)))
                .parameter(*made, format!("$response.body#/{field}"));
            for p in params.iter().filter(|p| *p != made) {
                link = link.parameter(*p, format!("$request.path.{p}"));
            }
            // Link names allow only letters, digits, `.`, `-` and `_`.
            let name: String = format!("{method}{path}")
                .chars()
                .filter(|c| !matches!(c, '{' | '}'))
                .map(|c| if c == '/' { '_' } else { c })
                .collect();
            response.links.insert(name, RefOr::T(link.build()));
        }
    }
}

/// A path as a URI fragment's JSON pointer token (`/` → `~1`, braces percent-encoded).
fn pointer(path: &str) -> String {
    path.replace('~', "~0")
        .replace('/', "~1")
        .replace('{', "%7B")
        .replace('}', "%7D")
}

/// Handlers of different resources share names (`get`, `list`, ...), which utoipa takes as
/// operation ids; the ids must be unique, so a shared one is qualified by the operation's tag.
fn unique_operation_ids(doc: &mut OpenApi) {
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for op in operations(doc) {
        if let Some(id) = &op.operation_id {
            *seen.entry(id.clone()).or_default() += 1;
        }
    }
    for op in operations(doc) {
        let (Some(id), Some(tag)) = (&op.operation_id, op.tags.as_ref().and_then(|t| t.first()))
        else {
            continue;
        };
        if seen.get(id).is_some_and(|n| *n > 1) {
            op.operation_id = Some(format!("{tag}_{id}"));
        }
    }
}

fn operations(doc: &mut OpenApi) -> impl Iterator<Item = &mut Operation> {
    doc.paths.paths.values_mut().flat_map(|item| {
        [
            item.get.as_mut(),
            item.put.as_mut(),
            item.post.as_mut(),
            item.delete.as_mut(),
            item.patch.as_mut(),
        ]
        .into_iter()
        .flatten()
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn operation_ids_are_unique() {
        let mut doc = crate::openapi();
        let mut ids = HashSet::new();
        for op in operations(&mut doc) {
            let id = op.operation_id.clone().unwrap_or_default();
            assert!(ids.insert(id.clone()), "operation id {id} twice");
        }
    }

    #[test]
    fn links_point_at_operations_and_fill_their_path() {
        let doc = crate::openapi();
        let mut links = 0;
        for item in doc.paths.paths.values() {
            let Some(post) = &item.post else { continue };
            for response in post.responses.responses.values() {
                let RefOr::T(response) = response else {
                    continue;
                };
                for link in response.links.values() {
                    let RefOr::T(link) = link else { continue };
                    let (path, method) = doc
                        .paths
                        .paths
                        .keys()
                        .flat_map(|p| ["get", "put", "post", "delete"].map(|m| (p, m)))
                        .find(|(p, m)| link.operation_ref == format!("#/paths/{}/{m}", pointer(p)))
                        .unwrap_or_else(|| panic!("{} points nowhere", link.operation_ref));
                    let mut want: Vec<&str> = path_params(path);
                    let mut got: Vec<&str> = link.parameters.keys().map(String::as_str).collect();
                    want.sort_unstable();
                    got.sort_unstable();
                    assert_eq!(got, want, "{method} {path}");
                    links += 1;
                }
            }
        }
        // Every operation with a path parameter is reached from at least one producer.
        assert!(links > 40, "{links} links");
    }
}
