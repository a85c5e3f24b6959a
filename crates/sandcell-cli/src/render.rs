//! Printing code events on a terminal: text as it comes, images saved to files.

use std::io::Write;
use std::path::PathBuf;

use base64::Engine as _;
use sandcell_engine::CodeEvent;
use sandcell_protocol::{CodeDone, CodeStatus, MimeBundle};

/// Prints the events of executions; saves images under `image_dir`.
pub struct Renderer {
    image_dir: PathBuf,
    images: usize,
}

impl Renderer {
    /// A renderer saving images in `image_dir` (created on the first image).
    pub fn new(image_dir: PathBuf) -> Self {
        Self {
            image_dir,
            images: 0,
        }
    }

    /// Prints one event.
    pub fn event(&mut self, event: &CodeEvent) -> anyhow::Result<()> {
        match event {
            CodeEvent::Stdout { text } => {
                let mut out = std::io::stdout().lock();
                out.write_all(text.as_bytes())?;
                out.flush()?;
            }
            CodeEvent::Stderr { text } => {
                let mut err = std::io::stderr().lock();
                err.write_all(text.as_bytes())?;
                err.flush()?;
            }
            CodeEvent::Display { data } | CodeEvent::Result { data } => self.bundle(data)?,
            CodeEvent::Error(e) => {
                let mut err = std::io::stderr().lock();
                if e.traceback.is_empty() {
                    writeln!(err, "{}: {}", e.ename, e.evalue)?;
                } else {
                    for line in &e.traceback {
                        writeln!(err, "{line}")?;
                    }
                }
            }
            CodeEvent::Done(done) => {
                if let Some(notice) = &done.notice {
                    eprintln!("sandcell: {notice}");
                }
                for a in &done.artifacts {
                    eprintln!(
                        "sandcell: artifact {} ({} bytes, {})",
                        a.path, a.size, a.mime
                    );
                }
            }
        }
        Ok(())
    }

    /// Prints a MIME bundle: images go to files, text is printed.
    fn bundle(&mut self, data: &MimeBundle) -> anyhow::Result<()> {
        for (mime, ext) in [("image/png", "png"), ("image/jpeg", "jpg")] {
            if let Some(b64) = data.get(mime).and_then(|v| v.as_str()) {
                let bytes = base64::engine::general_purpose::STANDARD.decode(b64.trim())?;
                return self.save(mime, ext, &bytes);
            }
        }
        if let Some(svg) = data.get("image/svg+xml").and_then(|v| v.as_str()) {
            return self.save("image/svg+xml", "svg", svg.as_bytes());
        }
        if let Some(text) = data.get("text/plain").and_then(|v| v.as_str()) {
            println!("{text}");
        } else if let Some((mime, _)) = data.iter().next() {
            println!("[{mime} output]");
        }
        Ok(())
    }

    /// Writes an image to the next numbered file and prints where.
    fn save(&mut self, mime: &str, ext: &str, bytes: &[u8]) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.image_dir)?;
        self.images += 1;
        let path = self.image_dir.join(format!("image-{}.{ext}", self.images));
        std::fs::write(&path, bytes)?;
        println!("[{mime} saved to {}]", path.display());
        Ok(())
    }
}

/// The process exit status for an execution's end: 0 ok, 1 error (Bash: its own status),
/// 130 interrupted, 124 timeout, 137 crashed.
pub fn exit_status(done: &CodeDone) -> u8 {
    match done.status {
        CodeStatus::Ok => 0,
        CodeStatus::Error => done
            .exit_code
            .and_then(|c| u8::try_from(c).ok())
            .filter(|c| *c != 0)
            .unwrap_or(1),
        CodeStatus::Interrupted => 130,
        CodeStatus::Timeout => 124,
        CodeStatus::Crashed => 137,
    }
}

/// Rows under headers, columns padded to their widest cell (the last one is not padded).
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                out.push_str(cell);
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod table_tests {
    #[test]
    fn columns_line_up() {
        let t = super::table(
            &["ID", "STATE"],
            &[
                vec!["sb-1".into(), "running".into()],
                vec!["sb-22222".into(), "stopped".into()],
            ],
        );
        assert_eq!(t, "ID        STATE\nsb-1      running\nsb-22222  stopped\n");
    }
}
