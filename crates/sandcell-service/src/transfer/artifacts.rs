//! The artifacts folder: files code executions leave in `/workspace/outputs` (plots saved,
//! data written), with their MIME types.

use sandcell_api::SandboxId;
use sandcell_api::transfer::{ARTIFACTS_DIR, Artifact, ArtifactList};
use sandcell_engine::EngineError;
use sandcell_protocol::{ErrorCode, FileKind};

use super::MAX_DEPTH;
use crate::{Caller, Service, ServiceResult};

impl Service {
    /// The files under the caller's sandbox `id`'s `/workspace/outputs`, by path (none when
    /// the folder does not exist).
    pub async fn list_artifacts(
        &self,
        caller: &Caller,
        id: &SandboxId,
    ) -> ServiceResult<ArtifactList> {
        let sandbox = self.fleet.sandbox(&caller.owner, id)?;
        let mut artifacts = Vec::new();
        let mut stack = vec![(ARTIFACTS_DIR.to_string(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            let entries = match sandbox.list_dir(&dir).await {
                Ok(e) => e,
                Err(EngineError::Guest(w)) if depth == 0 && w.code == ErrorCode::NotFound => {
                    break;
                }
                Err(e) => return Err(e.into()),
            };
            for e in entries {
                match e.kind {
                    FileKind::Dir if depth < MAX_DEPTH => stack.push((e.path, depth + 1)),
                    FileKind::File => artifacts.push(Artifact {
                        mime: sandcell_protocol::mime_of_name(&e.name).to_string(),
                        path: e.path,
                        size: e.size,
                        mtime: e.mtime,
                    }),
                    _ => {}
                }
            }
        }
        artifacts.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(ArtifactList { artifacts })
    }
}
