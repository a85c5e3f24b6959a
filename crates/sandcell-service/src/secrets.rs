//! Secrets: each a placeholder in the sandbox's environment, the value with its egress proxy
//! only (replaced for its hosts, over TLS the proxy terminates). Values are kept in memory
//! (the engine's egress hub), never in the store or in snapshots; records and snapshots keep
//! the names, placeholders and hosts, so restores and forks get the values this process
//! holds, and a restarted daemon refuses the placeholders until they are given again.

use sandcell_api::network::HostRule;
use sandcell_api::sandboxes::{SecretInput, SecretList, SecretRef, SecretState, SetSecrets};
use sandcell_egress::{Secret, Secrets};

use crate::{ServiceError, ServiceResult};

/// The proxy's secrets for `inputs` (checked already), each with a new placeholder.
pub fn secrets_of(inputs: &[SecretInput]) -> ServiceResult<Secrets> {
    bind(&[], inputs, true)
}

/// The secrets of a sandbox that holds placeholders `refs`, with the values (and hosts) in
/// `given` by name: a given one keeps its placeholder, a new name gets a new one
/// (`new_names`), or is refused. The others stay as `refs` has them, their values unheld
/// here (the hub fills them in where it holds them).
fn bind(refs: &[SecretRef], given: &[SecretInput], new_names: bool) -> ServiceResult<Secrets> {
    SecretInput::check_all(given)?;
    let hosts_of = |list: &[String]| {
        list.iter()
            .map(|h| h.parse::<HostRule>().map_err(ServiceError::invalid))
            .collect::<ServiceResult<Vec<_>>>()
    };
    let bad = |e: sandcell_egress::SecretError| ServiceError::invalid(e.to_string());
    let mut list = Vec::with_capacity(refs.len() + given.len());
    for input in given {
        let hosts = hosts_of(&input.hosts)?;
        let secret = match refs.iter().find(|r| r.name == input.name) {
            Some(r) => Secret::with_placeholder(&input.name, &input.value, &r.placeholder, hosts),
            None if new_names => Secret::new(&input.name, &input.value, hosts),
            None => {
                let names: Vec<&str> = refs.iter().map(|r| r.name.as_str()).collect();
                return Err(ServiceError::invalid(format!(
                    "there is no secret '{}' to give a value to (the snapshot's secrets: {})",
                    input.name,
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                )));
            }
        };
        list.push(secret.map_err(bad)?);
    }
    if !new_names {
        for r in refs
            .iter()
            .filter(|r| !given.iter().any(|g| g.name == r.name))
        {
            list.push(Secret::unheld(&r.name, &r.placeholder, hosts_of(&r.hosts)?).map_err(bad)?);
        }
    }
    Secrets::new(list).map_err(bad)
}

/// A snapshot's secrets (`refs`) with the values `given` for some of them (see [`bind`]).
pub fn rebind(refs: &[SecretRef], given: &[SecretInput]) -> ServiceResult<Secrets> {
    bind(refs, given, false)
}

/// A live sandbox's new set of secrets, `given`, keeping the placeholders of the names it
/// holds already (`refs`); the names not given are dropped.
pub fn replace(refs: &[SecretRef], given: &[SecretInput]) -> ServiceResult<Secrets> {
    bind(refs, given, true)
}

impl crate::Service {
    /// `id`'s secrets, without their values; `held` says whether this process has each
    /// value.
    pub fn get_secrets(
        &self,
        caller: &crate::Caller,
        id: &sandcell_api::SandboxId,
    ) -> ServiceResult<SecretList> {
        let record = self.fleet.get(&caller.owner, id)?;
        Ok(self.secret_list(&record.spec.secrets))
    }

    /// Gives live sandbox `id` the secrets in `req`, replacing those it had; a name it had
    /// keeps its placeholder. From its next request on.
    pub fn set_secrets(
        &self,
        caller: &crate::Caller,
        id: &sandcell_api::SandboxId,
        req: SetSecrets,
    ) -> ServiceResult<SecretList> {
        let record = self.fleet.get(&caller.owner, id)?;
        if record.spec.network == sandcell_engine::NetworkPolicy::Off {
            return Err(ServiceError::invalid(
                "secrets are put in by the egress proxy, which a sandbox with network 'off' has \
                 none of",
            ));
        }
        let secrets = replace(&record.spec.secrets, &req.secrets)?;
        let record = self.fleet.set_secrets(&caller.owner, id, secrets)?;
        self.audit(
            caller,
            "sandbox.secrets",
            Some(id),
            serde_json::json!({
                "secrets": record.spec.secrets.iter().map(|s| &s.name).collect::<Vec<_>>(),
            }),
        );
        Ok(self.secret_list(&record.spec.secrets))
    }

    fn secret_list(&self, refs: &[SecretRef]) -> SecretList {
        let hub = self.fleet.engine().egress();
        SecretList {
            secrets: refs
                .iter()
                .map(|r| SecretState {
                    name: r.name.clone(),
                    placeholder: r.placeholder.clone(),
                    hosts: r.hosts.clone(),
                    held: hub.holds(&r.placeholder),
                })
                .collect(),
        }
    }
}
