//! Exports: files and directories copied out of sandboxes.

use rusqlite::{OptionalExtension, Row, params, params_from_iter};

use crate::error::{StoreError, is_unique_violation};
use crate::records::{ExportKind, ExportRecord};
use crate::store::{Store, owner_and_sandbox, u64_from_sql, u64_to_sql};

const WHAT: &str = "export";

const COLUMNS: &str = "id, owner, sandbox_id, path, kind, created_at, size, sha256, stored_path";

/// A row before `kind` and `size` are checked.
struct RawExport {
    record: ExportRecord,
    kind: String,
    size: Option<i64>,
}

fn from_row(row: &Row<'_>) -> rusqlite::Result<RawExport> {
    Ok(RawExport {
        record: ExportRecord {
            id: row.get(0)?,
            owner: row.get(1)?,
            sandbox_id: row.get(2)?,
            path: row.get(3)?,
            kind: ExportKind::File,
            created_at: row.get(5)?,
            size: None,
            sha256: row.get(7)?,
            stored_path: row.get(8)?,
        },
        kind: row.get(4)?,
        size: row.get(6)?,
    })
}

impl RawExport {
    fn decode(self) -> Result<ExportRecord, StoreError> {
        let mut record = self.record;
        record.kind = ExportKind::parse(&self.kind).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "export {:?}: unknown kind {:?}",
                record.id, self.kind
            ))
        })?;
        record.size = u64_from_sql("export", &record.id, "size", self.size)?;
        Ok(record)
    }
}

impl Store {
    /// Inserts a new export record.
    pub fn insert_export(&self, export: &ExportRecord) -> Result<(), StoreError> {
        let inserted = self
            .conn()
            .prepare_cached(&format!(
                "INSERT INTO exports ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ))?
            .execute(params![
                export.id,
                export.owner,
                export.sandbox_id,
                export.path,
                export.kind.as_str(),
                export.created_at,
                u64_to_sql(export.size)?,
                export.sha256,
                export.stored_path,
            ]);
        match inserted {
            Err(e) if is_unique_violation(&e) => Err(StoreError::AlreadyExists {
                what: WHAT,
                id: export.id.clone(),
            }),
            other => other.map(drop).map_err(StoreError::from),
        }
    }

    /// The export with this id, if any.
    pub fn get_export(&self, id: &str) -> Result<Option<ExportRecord>, StoreError> {
        self.conn()
            .prepare_cached(&format!("SELECT {COLUMNS} FROM exports WHERE id = ?1"))?
            .query_row([id], from_row)
            .optional()?
            .map(RawExport::decode)
            .transpose()
    }

    /// Exports of `owner` (or everyone's) from `sandbox_id` (or any sandbox), oldest first.
    pub fn list_exports(
        &self,
        owner: Option<&str>,
        sandbox_id: Option<&str>,
    ) -> Result<Vec<ExportRecord>, StoreError> {
        let (where_clause, values) = owner_and_sandbox(owner, sandbox_id);
        let sql = format!("SELECT {COLUMNS} FROM exports{where_clause} ORDER BY created_at, id");
        let raws = {
            let conn = self.conn();
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(params_from_iter(values.iter()), from_row)?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        raws.into_iter().map(RawExport::decode).collect()
    }

    /// Deletes an export record (not the daemon's stored copy). Returns whether it existed.
    pub fn delete_export(&self, id: &str) -> Result<bool, StoreError> {
        let changed = self
            .conn()
            .prepare_cached("DELETE FROM exports WHERE id = ?1")?
            .execute([id])?;
        Ok(changed > 0)
    }
}
