//! Initial workspace files: what an Agent is created with (AGENTS.md, SOUL.md, …), applied
//! once into its workspace before the gateway first starts, never again.
//!
//! The names are checked here, on both sides, so a name that decodes is a safe relative path:
//! 1 to 4 components of `[A-Za-z0-9._-]`, none `.` or `..`, at most 200 bytes in all. The
//! contents travel base64-encoded inside `prepare-revision` (with their SHA-256, which hostd
//! recomputes) until the host has applied them; a manifest of names, sizes and digests stays.

use std::fmt;

use base64ct::{Base64, Encoding};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ident::{Sha256Hex, sha256};

/// Most files one Agent may be created with.
pub const WORKSPACE_MAX_FILES: usize = 32;
/// Largest file, in bytes.
pub const WORKSPACE_MAX_FILE_BYTES: usize = 64 * 1024;
/// Largest total of all files, in bytes (base64 in a prepare: about 171 KiB, well inside the
/// envelope limit next to the largest configuration).
pub const WORKSPACE_MAX_TOTAL_BYTES: usize = 128 * 1024;
/// Longest name, in bytes.
pub const WORKSPACE_NAME_MAX: usize = 200;
/// Deepest name, in components.
pub const WORKSPACE_NAME_MAX_DEPTH: usize = 4;

/// Why a name or a set of files is refused. Messages name the file, never its content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkspaceError {
    #[error("workspace file name must not be empty")]
    EmptyName,
    #[error(
        "workspace file name {name:?} is {len} bytes long; at most {WORKSPACE_NAME_MAX} are allowed"
    )]
    NameTooLong { name: String, len: usize },
    #[error(
        "workspace file name {name:?} must be a relative path (no leading '/', no empty component)"
    )]
    NotRelative { name: String },
    #[error("workspace file name {name:?} must not contain a '.' or '..' component")]
    DotComponent { name: String },
    #[error(
        "workspace file name {name:?} nests {depth} directories deep; at most {WORKSPACE_NAME_MAX_DEPTH} components are allowed"
    )]
    TooDeep { name: String, depth: usize },
    #[error(
        "workspace file name {name:?} contains {found:?}; only letters, digits, '.', '_', '-' and '/' between components are allowed"
    )]
    BadCharacter { name: String, found: char },
    #[error(
        "workspace file {name:?} is {size} bytes; at most {WORKSPACE_MAX_FILE_BYTES} are allowed"
    )]
    FileTooLarge { name: String, size: usize },
    #[error("{count} workspace files given; at most {WORKSPACE_MAX_FILES} are allowed")]
    TooMany { count: usize },
    #[error(
        "the workspace files total {total} bytes; at most {WORKSPACE_MAX_TOTAL_BYTES} are allowed"
    )]
    TotalTooLarge { total: usize },
    #[error("workspace file {name:?} is given twice")]
    Duplicate { name: String },
    #[error("workspace file {name:?} is both a file and a directory of {other:?}")]
    FileIsDirectory { name: String, other: String },
    #[error("workspace file {name:?}: contentBase64 is not valid base64")]
    BadBase64 { name: String },
    #[error("workspace file {name:?}: its content does not have the stated sha256")]
    DigestMismatch { name: String },
}

/// A checked workspace file name (a relative path inside the workspace).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkspaceName(String);

impl std::str::FromStr for WorkspaceName {
    type Err = WorkspaceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl WorkspaceName {
    /// Checks and wraps a name.
    pub fn new(value: impl Into<String>) -> Result<Self, WorkspaceError> {
        let name = value.into();
        let shown = || crate::ident::truncate_for_message(&name).to_owned();
        if name.is_empty() {
            return Err(WorkspaceError::EmptyName);
        }
        if name.len() > WORKSPACE_NAME_MAX {
            return Err(WorkspaceError::NameTooLong {
                name: shown(),
                len: name.len(),
            });
        }
        if let Some(found) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')))
        {
            return Err(WorkspaceError::BadCharacter {
                name: shown(),
                found,
            });
        }
        let components: Vec<&str> = name.split('/').collect();
        if components.iter().any(|c| c.is_empty()) {
            return Err(WorkspaceError::NotRelative { name: shown() });
        }
        if components.iter().any(|c| *c == "." || *c == "..") {
            return Err(WorkspaceError::DotComponent { name: shown() });
        }
        if components.len() > WORKSPACE_NAME_MAX_DEPTH {
            return Err(WorkspaceError::TooDeep {
                name: shown(),
                depth: components.len(),
            });
        }
        Ok(Self(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its components, outermost first.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }
}

impl fmt::Display for WorkspaceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for WorkspaceName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for WorkspaceName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        WorkspaceName::new(raw).map_err(serde::de::Error::custom)
    }
}

/// One file as the manifest records it: no content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkspaceFileMeta {
    pub name: WorkspaceName,
    pub size: u64,
    pub sha256: Sha256Hex,
}

/// One file with its content, as a prepare carries it.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkspaceFile {
    pub name: WorkspaceName,
    pub content: Vec<u8>,
}

impl fmt::Debug for WorkspaceFile {
    /// Never the content: it is the operator's and must not reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkspaceFile")
            .field("name", &self.name)
            .field("size", &self.content.len())
            .finish_non_exhaustive()
    }
}

impl WorkspaceFile {
    /// Its manifest entry.
    pub fn meta(&self) -> WorkspaceFileMeta {
        WorkspaceFileMeta {
            name: self.name.clone(),
            size: self.content.len() as u64,
            sha256: Sha256Hex::from_digest(&sha256(&self.content)),
        }
    }
}

/// The wire form of a [`WorkspaceFile`].
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WireFile {
    name: WorkspaceName,
    sha256: Sha256Hex,
    content_base64: String,
}

impl Serialize for WorkspaceFile {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let meta = self.meta();
        WireFile {
            name: meta.name,
            sha256: meta.sha256,
            content_base64: Base64::encode_string(&self.content),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for WorkspaceFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireFile::deserialize(deserializer)?;
        let name = wire.name.as_str().to_owned();
        if wire.content_base64.len() > (WORKSPACE_MAX_FILE_BYTES / 3 + 1) * 4 {
            return Err(serde::de::Error::custom(WorkspaceError::FileTooLarge {
                size: wire.content_base64.len() / 4 * 3,
                name,
            }));
        }
        let content = Base64::decode_vec(&wire.content_base64).map_err(|_| {
            serde::de::Error::custom(WorkspaceError::BadBase64 { name: name.clone() })
        })?;
        if Sha256Hex::from_digest(&sha256(&content)) != wire.sha256 {
            return Err(serde::de::Error::custom(WorkspaceError::DigestMismatch {
                name,
            }));
        }
        Ok(Self {
            name: wire.name,
            content,
        })
    }
}

/// What `prepare-revision` carries about an Agent's initial workspace files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkspaceSetup {
    /// Names, sizes and digests of every file: the host records them as the setup request
    /// before anything else, so the unit's start guard holds from the first prepare.
    pub manifest: Vec<WorkspaceFileMeta>,
    /// The contents, while the coordinator still holds them (until an activation succeeded
    /// after the host applied them). Without them a host that has not applied the setup yet
    /// refuses the prepare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<Vec<WorkspaceFile>>,
}

/// Checks a set of names and sizes against the limits: count, per-file size, total, no name
/// twice, no name that is also another one's directory.
pub fn check_set<'a>(
    entries: impl IntoIterator<Item = (&'a WorkspaceName, usize)>,
) -> Result<(), WorkspaceError> {
    let entries: Vec<(&WorkspaceName, usize)> = entries.into_iter().collect();
    if entries.len() > WORKSPACE_MAX_FILES {
        return Err(WorkspaceError::TooMany {
            count: entries.len(),
        });
    }
    let mut total = 0usize;
    let mut seen = std::collections::BTreeSet::new();
    for (name, size) in &entries {
        if *size > WORKSPACE_MAX_FILE_BYTES {
            return Err(WorkspaceError::FileTooLarge {
                name: name.to_string(),
                size: *size,
            });
        }
        total = total.saturating_add(*size);
        if !seen.insert(name.as_str()) {
            return Err(WorkspaceError::Duplicate {
                name: name.to_string(),
            });
        }
    }
    if total > WORKSPACE_MAX_TOTAL_BYTES {
        return Err(WorkspaceError::TotalTooLarge { total });
    }
    for name in &seen {
        let prefix = format!("{name}/");
        if let Some(other) = seen.iter().find(|o| o.starts_with(&prefix)) {
            return Err(WorkspaceError::FileIsDirectory {
                name: (*name).to_owned(),
                other: (*other).to_owned(),
            });
        }
    }
    Ok(())
}

impl WorkspaceSetup {
    /// Checks the manifest against the limits and, when contents are carried, that they are
    /// exactly the manifest's files.
    pub fn check(&self) -> Result<(), String> {
        check_set(
            self.manifest
                .iter()
                .map(|m| (&m.name, usize::try_from(m.size).unwrap_or(usize::MAX))),
        )
        .map_err(|e| e.to_string())?;
        if let Some(files) = &self.files {
            let mut given: Vec<WorkspaceFileMeta> = files.iter().map(WorkspaceFile::meta).collect();
            let mut wanted = self.manifest.clone();
            given.sort_by(|a, b| a.name.cmp(&b.name));
            wanted.sort_by(|a, b| a.name.cmp(&b.name));
            if given != wanted {
                return Err("the workspace files carried are not the manifest's files".to_owned());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Result<WorkspaceName, WorkspaceError> {
        WorkspaceName::new(s)
    }

    #[test]
    fn safe_names_are_accepted() {
        for ok in [
            "AGENTS.md",
            "SOUL.md",
            "memory/notes.md",
            ".gitignore",
            "a/b/c/d.txt",
        ] {
            assert!(name(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn unsafe_names_are_refused_naming_the_file() {
        let cases = [
            ("", "must not be empty"),
            ("/etc/passwd", "relative path"),
            ("a//b", "relative path"),
            ("a/", "relative path"),
            ("../x", "'..'"),
            ("a/./b", "'.'"),
            ("a/b/c/d/e", "nests 5"),
            ("bad\u{7}name", "contains '\\u{7}'"),
            ("tab\tname", "contains '\\t'"),
            ("sp ace", "contains ' '"),
            ("ünï", "contains 'ü'"),
        ];
        for (raw, want) in cases {
            let err = name(raw).unwrap_err().to_string();
            assert!(err.contains(want), "{raw:?}: {err}");
        }
        let long = "x".repeat(WORKSPACE_NAME_MAX + 1);
        assert!(name(&long).unwrap_err().to_string().contains("201 bytes"));
    }

    #[test]
    fn sets_are_bounded() {
        let a = name("a").unwrap();
        let ab = name("a/b").unwrap();
        assert!(
            check_set([(&a, 1), (&a, 1)])
                .unwrap_err()
                .to_string()
                .contains("twice")
        );
        assert!(
            check_set([(&a, 1), (&ab, 1)])
                .unwrap_err()
                .to_string()
                .contains("directory")
        );
        assert!(
            check_set([(&a, WORKSPACE_MAX_FILE_BYTES + 1)])
                .unwrap_err()
                .to_string()
                .contains("\"a\" is 65537 bytes")
        );
        let names: Vec<WorkspaceName> = (0..=WORKSPACE_MAX_FILES)
            .map(|i| name(&format!("f{i}")).unwrap())
            .collect();
        assert!(
            check_set(names.iter().map(|n| (n, 1)))
                .unwrap_err()
                .to_string()
                .contains("33 workspace files")
        );
        let three: Vec<WorkspaceName> = (0..3).map(|i| name(&format!("f{i}")).unwrap()).collect();
        assert!(
            check_set(three.iter().map(|n| (n, WORKSPACE_MAX_FILE_BYTES)))
                .unwrap_err()
                .to_string()
                .contains("total 196608")
        );
    }

    #[test]
    fn files_round_trip_and_a_wrong_digest_is_refused() {
        let f = WorkspaceFile {
            name: name("AGENTS.md").unwrap(),
            content: b"# hello\n\x00\xff".to_vec(),
        };
        let json = serde_json::to_value(&f).unwrap();
        let back: WorkspaceFile = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, f);
        let mut bad = json.clone();
        bad["sha256"] = serde_json::json!("0".repeat(64));
        let err = serde_json::from_value::<WorkspaceFile>(bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not have the stated sha256"), "{err}");
        let mut bad = json;
        bad["contentBase64"] = serde_json::json!("!!!");
        let err = serde_json::from_value::<WorkspaceFile>(bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not valid base64"), "{err}");
        assert!(!format!("{f:?}").contains("hello"));
    }

    #[test]
    fn carried_files_must_be_the_manifest() {
        let f = WorkspaceFile {
            name: name("AGENTS.md").unwrap(),
            content: b"x".to_vec(),
        };
        let mut setup = WorkspaceSetup {
            manifest: vec![f.meta()],
            files: Some(vec![f.clone()]),
        };
        assert!(setup.check().is_ok());
        setup.files = Some(vec![]);
        assert!(setup.check().is_err());
        setup.files = None;
        assert!(setup.check().is_ok());
    }
}
