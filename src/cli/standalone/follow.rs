//! The followed files: the config's `pools` and `hotSpares` files and every
//! `*.yaml` / `*.yml` file directly in its `resources` directory (hidden
//! files aside), each a stream of
//! resource documents of any kind. A file is read again when its content
//! changed and decoded as a whole ([`crate::cli::documents`]): a good file
//! replaces what it held, a bad one is reported once — file, document,
//! resource, field, line and column, why — and its last good content stays
//! in force (a file that becomes bad does not delete what it held: a
//! half-saved edit must not take a channel off the air). A removed file
//! takes its resources with it. The wanted state is the union of every
//! file's content in force; a resource defined in two files is taken from
//! the first (in path order) and reported in the other.
//!
//! What an update may not change (the CRDs' transition rules: a drain's
//! node, a migration's job) refuses the file as the API server refuses the
//! update.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cli::documents::{self, Document, DocumentError, Kind, OfKind, Problem, Resource, ResourceKey};

/// Where followed files come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// One file.
    File(PathBuf),
    /// Every `*.yaml` / `*.yml` file directly in a directory.
    Directory(PathBuf),
}

/// One resource wanted, with where it was read.
#[derive(Clone, Debug)]
pub struct Wanted {
    pub resource: Resource,
    pub file: PathBuf,
    /// Its document in the file, counting from 0.
    pub index: usize,
    /// The file's text it was read from (to locate fields in).
    pub text: Arc<str>,
}

impl Wanted {
    /// A problem at `path` of this resource's document, located in its file.
    pub fn problem(&self, path: documents::FieldPath, message: impl Into<String>) -> Problem {
        Problem::at(&self.text, self.index, path, message)
    }

    /// Where it is, for messages: `file: document N (Kind ns/name)`.
    pub fn origin(&self) -> String {
        format!(
            "{}: document {} ({})",
            self.file.display(),
            self.index + 1,
            self.resource.key()
        )
    }
}

/// Why a file is not (wholly) in force.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "reason")]
pub enum FileError {
    /// It could not be read.
    Unreadable {
        /// Why.
        message: String,
    },
    /// Documents were refused.
    Invalid {
        /// Every refused document.
        documents: Vec<DocumentError>,
    },
}

/// One followed file.
#[derive(Debug)]
struct Followed {
    /// The text last read (to tell a change).
    read: Option<Arc<str>>,
    /// The content in force: the last good read.
    in_force: Option<(Arc<str>, Vec<Document>)>,
    /// Why the last read is not in force.
    error: Option<FileError>,
}

/// What a file's status says.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileStatus {
    pub file: PathBuf,
    /// How many resources of it are in force (from its last good read).
    pub resources: usize,
    /// Why its last read is not in force; its last good content is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<FileError>,
    /// Resources of it taken from another file that defines them first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shadowed: Vec<String>,
}

/// Every followed file and the wanted state they add up to.
#[derive(Debug)]
pub struct Files {
    sources: Vec<Source>,
    files: BTreeMap<PathBuf, Followed>,
    /// Why a source directory could not be listed (its files stay as read).
    unlisted: BTreeMap<PathBuf, String>,
    wanted: BTreeMap<ResourceKey, Wanted>,
    /// Per file, the resources another file defines first.
    shadowed: BTreeMap<PathBuf, Vec<ResourceKey>>,
}

impl Files {
    /// Follows `sources`; nothing is read until [`Files::scan`].
    pub fn new(sources: Vec<Source>) -> Self {
        Self {
            sources,
            files: BTreeMap::new(),
            unlisted: BTreeMap::new(),
            wanted: BTreeMap::new(),
            shadowed: BTreeMap::new(),
        }
    }

    /// Reads what changed and recomputes the wanted state. Every problem
    /// is printed once: when it appears (a file changed, a directory
    /// became unreadable), never again until it changes.
    pub fn scan(&mut self) {
        let mut present = Vec::new();
        for source in &self.sources.clone() {
            match source {
                Source::File(path) => present.push(path.clone()),
                Source::Directory(dir) => match list(dir) {
                    Ok(files) => {
                        if self.unlisted.remove(dir).is_some() {
                            eprintln!("standalone: {}: readable again", dir.display());
                        }
                        present.extend(files);
                    }
                    Err(message) => {
                        if self.unlisted.get(dir) != Some(&message) {
                            eprintln!(
                                "error: {}: {message}; the files read from it stay in force",
                                dir.display()
                            );
                            self.unlisted.insert(dir.clone(), message);
                        }
                        // Keep what was read from it.
                        present.extend(self.files.keys().filter(|f| f.starts_with(dir)).cloned());
                    }
                },
            }
        }
        present.sort();
        present.dedup();
        self.files.retain(|path, _| present.contains(path));
        for path in present {
            self.read(&path);
        }
        self.merge();
    }

    fn read(&mut self, path: &Path) {
        // The wanted state before this scan: what an update is checked against.
        let wanted_before = &self.wanted;
        let followed = self.files.entry(path.to_owned()).or_insert(Followed {
            read: None,
            in_force: None,
            error: None,
        });
        let text: Arc<str> = match std::fs::read_to_string(path) {
            Ok(text) => text.into(),
            Err(e) => {
                let error = FileError::Unreadable {
                    message: format!("cannot read the file: {e}"),
                };
                if followed.error.as_ref() != Some(&error) {
                    eprintln!(
                        "error: {}: {}",
                        path.display(),
                        describe(&error, followed.in_force.is_some())
                    );
                    followed.error = Some(error);
                }
                followed.read = None;
                return;
            }
        };
        if followed.read.as_deref() == Some(&*text) {
            return;
        }
        followed.read = Some(text.clone());
        let decoded = documents::decode_file(&text, &Kind::ALL).and_then(|documents| {
            // The transition rules, against the version in force.
            let refused: Vec<DocumentError> = documents
                .iter()
                .filter_map(|document| {
                    let old = wanted_before.get(&document.resource.key())?;
                    let problems = documents::update_problems(&text, document, &old.resource);
                    (!problems.is_empty()).then(|| DocumentError {
                        document: document.index + 1,
                        resource: Some(document.resource.key().to_string()),
                        problems,
                    })
                })
                .collect();
            if refused.is_empty() {
                Ok(documents)
            } else {
                Err(refused)
            }
        });
        match decoded {
            Ok(documents) => {
                if followed.error.take().is_some() {
                    eprintln!(
                        "standalone: {}: accepted, {} resource(s) in force",
                        path.display(),
                        documents.len()
                    );
                }
                followed.in_force = Some((text, documents));
            }
            Err(documents) => {
                let error = FileError::Invalid { documents };
                eprintln!(
                    "error: {}: {}",
                    path.display(),
                    describe(&error, followed.in_force.is_some())
                );
                followed.error = Some(error);
            }
        }
    }

    /// The union of the files in force, the first definition of a
    /// resource winning.
    fn merge(&mut self) {
        let mut wanted: BTreeMap<ResourceKey, Wanted> = BTreeMap::new();
        let mut shadowed: BTreeMap<PathBuf, Vec<ResourceKey>> = BTreeMap::new();
        for (path, followed) in &self.files {
            let Some((text, documents)) = &followed.in_force else {
                continue;
            };
            for document in documents {
                let key = document.resource.key();
                if let Some(first) = wanted.get(&key) {
                    if !self.shadowed.get(path).is_some_and(|keys| keys.contains(&key)) {
                        eprintln!(
                            "error: {}: document {}: {key} is already defined in {}; that definition is in force",
                            path.display(),
                            document.index + 1,
                            first.file.display()
                        );
                    }
                    shadowed.entry(path.clone()).or_default().push(key);
                    continue;
                }
                wanted.insert(
                    key,
                    Wanted {
                        resource: document.resource.clone(),
                        file: path.clone(),
                        index: document.index,
                        text: text.clone(),
                    },
                );
            }
        }
        self.wanted = wanted;
        self.shadowed = shadowed;
    }

    /// The wanted resources of `kind`.
    pub fn of_kind(&self, kind: Kind) -> impl Iterator<Item = &Wanted> {
        self.wanted.values().filter(move |w| w.resource.kind() == kind)
    }

    /// The wanted resources of one kind, each with its document.
    pub fn each<'a, K: OfKind + 'a>(&'a self) -> impl Iterator<Item = (&'a Wanted, &'a K)> {
        self.wanted.values().filter_map(|w| K::of(&w.resource).map(|r| (w, r)))
    }

    /// Every followed file's status, in path order.
    pub fn status(&self) -> Vec<FileStatus> {
        self.files
            .iter()
            .map(|(path, followed)| FileStatus {
                file: path.clone(),
                resources: followed.in_force.as_ref().map_or(0, |(_, d)| d.len()),
                error: followed.error.clone(),
                shadowed: self
                    .shadowed
                    .get(path)
                    .into_iter()
                    .flatten()
                    .map(ToString::to_string)
                    .collect(),
            })
            .collect()
    }
}

/// The `*.yaml` / `*.yml` files directly in `dir`, sorted. Hidden files
/// (`.name.yaml`: what editors save to before renaming) are not followed.
fn list(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot list the directory: {e}"))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let hidden = p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'));
            !hidden && p.is_file() && p.extension().is_some_and(|x| x == "yaml" || x == "yml")
        })
        .collect();
    files.sort();
    Ok(files)
}

/// A file's error as one message, with what stays in force.
fn describe(error: &FileError, had_good: bool) -> String {
    let keeps = if had_good {
        "its last good content stays in force"
    } else {
        "nothing of it is in force"
    };
    match error {
        FileError::Unreadable { message } => format!("{message}; {keeps}"),
        FileError::Invalid { documents } => {
            let each: Vec<String> = documents.iter().map(ToString::to_string).collect();
            format!("{}; the file is refused, {keeps}", each.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {name: ch1}\nspec:\n  pool: production\n  jobs: [{jobName: encode}]\n";

    fn bundles(files: &Files) -> Vec<String> {
        files
            .of_kind(Kind::Bundle)
            .map(|w| w.resource.key().to_string())
            .collect()
    }

    #[test]
    fn a_file_that_turns_bad_keeps_its_last_good_content_and_a_removed_one_goes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ch1.yaml");
        std::fs::write(&file, GOOD).unwrap();
        let mut files = Files::new(vec![Source::Directory(dir.path().to_owned())]);
        files.scan();
        assert_eq!(bundles(&files), ["Bundle default/ch1"]);
        std::fs::write(&file, GOOD.replace("jobName", "jobNam")).unwrap();
        files.scan();
        assert_eq!(bundles(&files), ["Bundle default/ch1"]);
        let status = files.status();
        let Some(FileError::Invalid { documents }) = &status[0].error else {
            panic!("refused: {status:?}")
        };
        assert_eq!(documents[0].problems[0].path.to_string(), "spec.jobs[0]");
        std::fs::remove_file(&file).unwrap();
        files.scan();
        assert!(bundles(&files).is_empty());
        assert!(files.status().is_empty());
    }

    #[test]
    fn a_drain_cannot_change_its_node() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("drain.yaml");
        let drain =
            "apiVersion: automanager.norsk.video/v1alpha1\nkind: NodeDrain\nmetadata: {name: d}\nspec: {nodeId: n1}\n";
        std::fs::write(&file, drain).unwrap();
        let mut files = Files::new(vec![Source::File(file.clone())]);
        files.scan();
        std::fs::write(&file, drain.replace("n1", "n2")).unwrap();
        files.scan();
        let Resource::NodeDrain(kept) = &files.of_kind(Kind::NodeDrain).next().unwrap().resource else {
            panic!("a drain")
        };
        assert_eq!(kept.spec.node_id, "n1");
        assert!(files.status()[0].error.is_some());
    }

    #[test]
    fn the_first_file_defining_a_resource_wins() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), GOOD).unwrap();
        std::fs::write(dir.path().join("b.yaml"), GOOD.replace("production", "other")).unwrap();
        let mut files = Files::new(vec![Source::Directory(dir.path().to_owned())]);
        files.scan();
        let wanted = files.of_kind(Kind::Bundle).next().unwrap();
        assert!(wanted.file.ends_with("a.yaml"));
        assert_eq!(files.status()[1].shadowed, ["Bundle default/ch1"]);
    }
}
