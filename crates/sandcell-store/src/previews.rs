//! Ports of sandboxes whose previews their owners made public.

use rusqlite::params;

use crate::error::StoreError;
use crate::store::Store;

impl Store {
    /// Makes port `port` of sandbox `sandbox_id` public on `owner`'s word, or (`None`) no
    /// longer public.
    pub fn set_public_port(
        &self,
        sandbox_id: &str,
        port: u16,
        owner: Option<&str>,
    ) -> Result<(), StoreError> {
        let conn = self.conn();
        match owner {
            Some(owner) => conn
                .prepare_cached(
                    "INSERT OR REPLACE INTO public_ports (sandbox_id, port, owner) \
                     VALUES (?1, ?2, ?3)",
                )?
                .execute(params![sandbox_id, port, owner])?,
            None => conn
                .prepare_cached("DELETE FROM public_ports WHERE sandbox_id = ?1 AND port = ?2")?
                .execute(params![sandbox_id, port])?,
        };
        Ok(())
    }

    /// Every public port: (sandbox id, port, owner).
    pub fn public_ports(&self) -> Result<Vec<(String, u16, String)>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT sandbox_id, port, owner FROM public_ports ORDER BY sandbox_id, port",
        )?;
        let rows = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
