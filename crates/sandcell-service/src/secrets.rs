//! Secrets at create: each a placeholder in the sandbox's environment, the value with its
//! egress proxy only (replaced for its hosts, over TLS the proxy terminates). Kept in memory:
//! not in the store, not in snapshots; a restarted daemon has none of them.

use sandcell_api::network::HostRule;
use sandcell_api::sandboxes::SecretInput;
use sandcell_egress::{Secret, Secrets};

use crate::{ServiceError, ServiceResult};

/// The proxy's secrets for `inputs` (checked already), each with a new placeholder.
pub fn secrets_of(inputs: &[SecretInput]) -> ServiceResult<Secrets> {
    let mut list = Vec::with_capacity(inputs.len());
    for input in inputs {
        let hosts = input
            .hosts
            .iter()
            .map(|h| h.parse::<HostRule>().map_err(ServiceError::invalid))
            .collect::<ServiceResult<Vec<_>>>()?;
        let secret = Secret::new(input.name.clone(), input.value.clone(), hosts)
            .map_err(|e| ServiceError::invalid(e.to_string()))?;
        list.push(secret);
    }
    Secrets::new(list).map_err(|e| ServiceError::invalid(e.to_string()))
}
