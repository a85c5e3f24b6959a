//! Context variables of Python and Node kernels: get, set, clear, list.

use std::collections::BTreeMap;
use std::sync::Arc;

use sandcell_protocol::{
    ErrorCode, GuestMessage, Language, Unrepresentable, VariableInfo, Variables, WireError,
};
use serde_json::{Value, json};

use crate::shared::Shared;

use super::kernel_call;
use super::table::Context;

fn string_list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn variables_supported(ctx: &Context) -> Result<(), WireError> {
    match ctx.language {
        Language::Python | Language::Node => Ok(()),
        other => Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!("context variables are available for python and node, not {other}"),
        )),
    }
}

/// A variables request to a Python or Node context.
async fn variables_call(
    shared: &Arc<Shared>,
    context: &str,
    req: Value,
) -> Result<Value, WireError> {
    let ctx = shared.kernels.existing(context)?;
    variables_supported(&ctx)?;
    kernel_call(shared, &ctx, req).await
}

/// `GetVariables`.
pub(crate) async fn get_variables(
    shared: &Arc<Shared>,
    context: &str,
    names: Option<Vec<String>>,
) -> Result<GuestMessage, WireError> {
    let v = variables_call(shared, context, json!({"op": "get_vars", "names": names})).await?;
    let values = v["values"]
        .as_object()
        .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let unrepresentable = v["unrepresentable"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, d)| {
                    (
                        k.clone(),
                        Unrepresentable {
                            type_name: d["type"].as_str().unwrap_or("?").to_string(),
                            repr: d["repr"].as_str().unwrap_or_default().to_string(),
                        },
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(GuestMessage::Variables(Variables {
        values,
        unrepresentable,
        missing: string_list(&v["missing"]),
    }))
}

/// `SetVariables`.
pub(crate) async fn set_variables(
    shared: &Arc<Shared>,
    context: &str,
    values: BTreeMap<String, Value>,
) -> Result<GuestMessage, WireError> {
    let v = variables_call(shared, context, json!({"op": "set_vars", "values": values})).await?;
    Ok(GuestMessage::VariableNames {
        names: string_list(&v["set"]),
    })
}

/// `ClearVariables`.
pub(crate) async fn clear_variables(
    shared: &Arc<Shared>,
    context: &str,
    names: Option<Vec<String>>,
) -> Result<GuestMessage, WireError> {
    let v = variables_call(shared, context, json!({"op": "clear_vars", "names": names})).await?;
    Ok(GuestMessage::VariableNames {
        names: string_list(&v["cleared"]),
    })
}

/// `ListVariables`.
pub(crate) async fn list_variables(
    shared: &Arc<Shared>,
    context: &str,
) -> Result<GuestMessage, WireError> {
    let v = variables_call(shared, context, json!({"op": "list_vars"})).await?;
    let variables = v["variables"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|d| VariableInfo {
                    name: d["name"].as_str().unwrap_or_default().to_string(),
                    type_name: d["type"].as_str().unwrap_or("?").to_string(),
                    json: d["json"].as_bool().unwrap_or(false),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(GuestMessage::VariableList { variables })
}
