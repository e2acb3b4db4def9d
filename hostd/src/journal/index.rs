//! The journal's prune index, `.index`: one line per entry, `<expiresAt> <operation id>`, in
//! the order the entries were first written, behind a fixed header naming the boot that wrote
//! it, the offset of the first line still to look at (`head`) and how many entries the lines
//! from there stand for (`live`).
//!
//! It lets pruning find the oldest entries without listing the journal directory or reading
//! any entry: a prune at the limit reads one bounded chunk of the index from `head` and
//! removes the oldest expired entries there, so its cost does not grow with the journal.
//!
//! A line is appended (under `.index.lock`) before its entry is first written, so every entry
//! of this boot has a line; a line whose entry is missing (its write failed, or a killed
//! prune removed it before moving `head`) is dropped when pruning reaches it. The index is not
//! fsynced: when a journal is used in a boot other than the one the header names (a crash may
//! have lost lines), or the header is unreadable, or there is no index (a journal of an earlier
//! hostd), it is rebuilt from the directory, reading every entry once, under the lock. Entries
//! an older hostd writes in the same boot have no line, and are indexed at the next rebuild.
//!
//! An entry removed behind one that must stay (not expired yet, or running) is marked by
//! turning its line's first byte into `-`; `head` passes such lines later. The index is
//! rewritten without its consumed prefix once that prefix is larger than the rest.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use clawfleet_protocol::OperationId;

use crate::fsutil::{self, FsError};

/// The index file; never an entry's name.
pub(super) const INDEX_FILE: &str = ".index";
/// Serialises every use of the index between sessions; never an entry's name.
const INDEX_LOCK: &str = ".index.lock";
/// The header's size: `clawfleet-journal-index 1 <boot> <head> <live>`, padded with spaces,
/// ending in a newline.
const HEADER_LEN: u64 = 128;
const MAGIC: &str = "clawfleet-journal-index";
/// How much of the index one prune reads.
const CHUNK: usize = 64 * 1024;
/// How many lines one prune looks at, at most (and so how many entries it removes).
pub(super) const SCAN_LIMIT: usize = 256;
/// The consumed prefix is cut off once it is at least this large and larger than the rest.
const COMPACT_MIN: u64 = 256 * 1024;

/// The header's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Header {
    boot: String,
    head: u64,
    live: u64,
}

impl Header {
    fn encode(&self) -> Vec<u8> {
        let mut text = format!("{MAGIC} 1 {} {} {}", self.boot, self.head, self.live);
        let width = usize::try_from(HEADER_LEN).unwrap_or(128) - 1;
        while text.len() < width {
            text.push(' ');
        }
        text.truncate(width);
        text.push('\n');
        text.into_bytes()
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        if u64::try_from(bytes.len()).ok()? != HEADER_LEN || bytes.last() != Some(&b'\n') {
            return None;
        }
        let text = std::str::from_utf8(bytes).ok()?;
        let mut words = text.split_ascii_whitespace();
        if words.next()? != MAGIC || words.next()? != "1" {
            return None;
        }
        let boot = words.next()?.to_owned();
        let head = words.next()?.parse().ok()?;
        let live = words.next()?.parse().ok()?;
        if words.next().is_some() || head < HEADER_LEN {
            return None;
        }
        Some(Self { boot, head, live })
    }
}

/// One line of the index, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Line {
    /// Where the line starts in the file.
    pub offset: u64,
    /// Where the next one starts.
    pub end: u64,
    /// Marked removed (`-`), or not readable as a line (dropped as well).
    pub dead: bool,
    pub expires_at: u64,
    pub id: Option<OperationId>,
}

/// The index, locked for the caller (until dropped).
#[derive(Debug)]
pub(super) struct Locked {
    _lock: File,
    file: File,
    path: PathBuf,
    header: Header,
    len: u64,
}

/// What a rebuild needs from the journal: every entry's `(startedAt, expiresAt, id)`.
pub(super) type Scan<'a> = &'a mut dyn FnMut() -> Result<Vec<(u64, u64, OperationId)>, FsError>;

/// The boot name as the header writes it (one word).
fn boot_word(boot: Option<&str>) -> String {
    match boot {
        Some(b) if !b.is_empty() && !b.contains(|c: char| c.is_ascii_whitespace()) => b.to_owned(),
        Some(b) if !b.is_empty() => b.split_ascii_whitespace().collect::<Vec<_>>().join("_"),
        _ => "-".to_owned(),
    }
}

fn open_rw(path: &Path, create: bool) -> Result<File, FsError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
        .map_err(fsutil::io_err(path))
}

impl Locked {
    /// Takes the index lock and opens the index, rebuilding it first (through `scan`) when it
    /// is missing, unreadable or of another boot.
    pub fn open(dir: &Path, boot: Option<&str>, scan: Scan<'_>) -> Result<Self, FsError> {
        let lock_path = dir.join(INDEX_LOCK);
        let lock = open_rw(&lock_path, true)?;
        lock.lock().map_err(fsutil::io_err(&lock_path))?;
        let path = dir.join(INDEX_FILE);
        let boot = boot_word(boot);
        if let Some(found) = Self::open_valid(&path, &boot)? {
            let (file, header, len) = found;
            return Ok(Self {
                _lock: lock,
                file,
                path,
                header,
                len,
            });
        }
        let mut entries = scan()?;
        entries.sort();
        let mut bytes = Header {
            boot: boot.clone(),
            head: HEADER_LEN,
            live: u64::try_from(entries.len()).unwrap_or(u64::MAX),
        }
        .encode();
        for (_, expires_at, id) in &entries {
            bytes.extend_from_slice(format!("{expires_at} {id}\n").as_bytes());
        }
        // Not fsynced: a crash makes the next boot rebuild it anyway.
        fsutil::replace_quickly(&path, &bytes, 0o600)?;
        tracing::info!(entries = entries.len(), "rebuilt the journal's prune index");
        match Self::open_valid(&path, &boot)? {
            Some((file, header, len)) => Ok(Self {
                _lock: lock,
                file,
                path,
                header,
                len,
            }),
            None => Err(FsError::Io {
                path: path.display().to_string(),
                source: std::io::Error::other("the rebuilt prune index does not read back"),
            }),
        }
    }

    /// The index at `path` with its header and length, if it is there and of `boot`.
    fn open_valid(path: &Path, boot: &str) -> Result<Option<(File, Header, u64)>, FsError> {
        let file = match open_rw(path, false) {
            Ok(f) => f,
            Err(FsError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let len = file.metadata().map_err(fsutil::io_err(path))?.len();
        if len < HEADER_LEN {
            return Ok(None);
        }
        let mut buf = vec![0u8; usize::try_from(HEADER_LEN).unwrap_or(128)];
        file.read_exact_at(&mut buf, 0)
            .map_err(fsutil::io_err(path))?;
        Ok(Header::decode(&buf)
            .filter(|h| h.boot == boot && h.head <= len)
            .map(|h| (file, h, len)))
    }

    /// How many entries the index stands for.
    pub fn live(&self) -> u64 {
        self.header.live
    }

    /// Adds a line for an entry about to be written.
    pub fn append(&mut self, id: &OperationId, expires_at: u64) -> Result<(), FsError> {
        let line = format!("{expires_at} {id}\n");
        self.file
            .write_all_at(line.as_bytes(), self.len)
            .map_err(fsutil::io_err(&self.path))?;
        self.len += u64::try_from(line.len()).unwrap_or(0);
        self.header.live += 1;
        self.write_header()
    }

    fn write_header(&self) -> Result<(), FsError> {
        self.file
            .write_all_at(&self.header.encode(), 0)
            .map_err(fsutil::io_err(&self.path))
    }

    /// Up to [`SCAN_LIMIT`] lines from `head` (one read of at most [`CHUNK`] bytes).
    pub fn lines(&self) -> Result<Vec<Line>, FsError> {
        let want = usize::try_from(self.len - self.header.head)
            .unwrap_or(CHUNK)
            .min(CHUNK);
        let mut buf = vec![0u8; want];
        self.file
            .read_exact_at(&mut buf, self.header.head)
            .map_err(fsutil::io_err(&self.path))?;
        let mut out = Vec::new();
        let mut at = 0usize;
        while out.len() < SCAN_LIMIT {
            let Some(nl) = buf[at..].iter().position(|b| *b == b'\n') else {
                break;
            };
            let raw = &buf[at..at + nl];
            let offset = self.header.head + u64::try_from(at).unwrap_or(0);
            let end = offset + u64::try_from(nl + 1).unwrap_or(0);
            let parsed = std::str::from_utf8(raw).ok().and_then(|text| {
                let (expires, id) = text.split_once(' ')?;
                Some((expires.parse::<u64>().ok()?, OperationId::new(id).ok()?))
            });
            out.push(match parsed {
                Some((expires_at, id)) => Line {
                    offset,
                    end,
                    dead: false,
                    expires_at,
                    id: Some(id),
                },
                None => Line {
                    offset,
                    end,
                    dead: true,
                    expires_at: 0,
                    id: None,
                },
            });
            at += nl + 1;
        }
        Ok(out)
    }

    /// Marks a line removed (its entry is gone; `head` has not passed it yet).
    pub fn mark_dead(&self, line: &Line) -> Result<(), FsError> {
        self.file
            .write_all_at(b"-", line.offset)
            .map_err(fsutil::io_err(&self.path))
    }

    /// Records that lines before `head` need no more looking at and that `removed` entries
    /// are gone, then cuts the consumed prefix off when it has grown large.
    pub fn advance(&mut self, head: u64, removed: u64) -> Result<(), FsError> {
        let head = head.clamp(self.header.head, self.len);
        if head == self.header.head && removed == 0 {
            return Ok(());
        }
        self.header.head = head;
        self.header.live = self.header.live.saturating_sub(removed);
        if head >= COMPACT_MIN && head - HEADER_LEN > self.len - head {
            return self.compact();
        }
        self.write_header()
    }

    /// Rewrites the index without its consumed prefix (not fsynced, as ever).
    fn compact(&mut self) -> Result<(), FsError> {
        let rest_len = usize::try_from(self.len - self.header.head).unwrap_or(0);
        let mut rest = vec![0u8; rest_len];
        self.file
            .read_exact_at(&mut rest, self.header.head)
            .map_err(fsutil::io_err(&self.path))?;
        let header = Header {
            head: HEADER_LEN,
            ..self.header.clone()
        };
        let mut bytes = header.encode();
        bytes.extend_from_slice(&rest);
        fsutil::replace_quickly(&self.path, &bytes, 0o600)?;
        self.file = open_rw(&self.path, false)?;
        self.len = u64::try_from(bytes.len()).unwrap_or(0);
        self.header = header;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_reads_back_and_refuses_what_it_did_not_write() {
        let h = Header {
            boot: "b0a1".into(),
            head: 128,
            live: 7,
        };
        let bytes = h.encode();
        assert_eq!(bytes.len(), 128);
        assert_eq!(Header::decode(&bytes), Some(h));
        assert_eq!(Header::decode(b"garbage\n"), None);
        let mut short_head = Header {
            boot: "b".into(),
            head: 3,
            live: 0,
        }
        .encode();
        assert_eq!(Header::decode(&short_head), None);
        short_head[127] = b' ';
        assert_eq!(Header::decode(&short_head), None);
        assert_eq!(boot_word(Some("a b")), "a_b");
        assert_eq!(boot_word(None), "-");
    }
}
