//! `--log-dir`: the log also goes to daily files `DIR/sgl-router.YYYY-MM-DD`
//! (UTC), a new file at the first line of each day; old files are left for
//! the operator's rotation (logrotate, a sidecar) to remove.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A writer to the day's file, shared by every thread that logs.
#[derive(Debug, Clone)]
pub(crate) struct DailyFile {
    inner: Arc<Mutex<Open>>,
}

#[derive(Debug)]
struct Open {
    dir: PathBuf,
    day: i64,
    file: File,
}

/// Days since 1970-01-01, UTC.
fn today() -> i64 {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    (secs / 86_400) as i64
}

/// The file of day number `day`: `DIR/sgl-router.YYYY-MM-DD`.
fn file_name(day: i64) -> String {
    renderer::strftime("sgl-router.%Y-%m-%d", day * 86_400)
}

fn open(dir: &Path, day: i64) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(dir.join(file_name(day)))
}

impl DailyFile {
    /// Creates `dir` if needed and opens today's file (an error here is a startup error).
    pub(crate) fn new(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let day = today();
        let file = open(dir, day)?;
        Ok(Self { inner: Arc::new(Mutex::new(Open { dir: dir.to_path_buf(), day, file })) })
    }
}

impl Write for DailyFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut o = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let day = today();
        if day != o.day {
            // A file that cannot be opened keeps the day's old one: the line is not lost.
            if let Ok(f) = open(&o.dir, day) {
                o.file = f;
                o.day = day;
            }
        }
        o.file.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).file.flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for DailyFile {
    type Writer = DailyFile;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn day_numbers_become_dates() {
        assert_eq!(file_name(0), "sgl-router.1970-01-01");
        assert_eq!(file_name(19_723), "sgl-router.2024-01-01");
        assert_eq!(file_name(19_782), "sgl-router.2024-02-29");
        assert_eq!(file_name(20_788), "sgl-router.2026-12-01");
    }

    #[test]
    fn lines_go_to_the_days_file() {
        let dir = std::env::temp_dir().join(format!("sgl-router-logs-{}", std::process::id()));
        let mut f = DailyFile::new(&dir).unwrap();
        f.write_all(b"one line\n").unwrap();
        let written = std::fs::read_to_string(dir.join(file_name(today()))).unwrap();
        assert_eq!(written, "one line\n");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
