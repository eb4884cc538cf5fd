//! Strict YAML decoding: a key the target type does not know is refused
//! with its path, as the API server refuses a field its schema does not
//! declare (`kubectl apply`'s strict field validation), instead of being
//! dropped while the field it was meant to be silently takes its default.
//!
//! Detection is generic — whatever fields a type declares are the known
//! ones, so a field added to a type is accepted at once: the document is
//! decoded through [`serde_ignored`] (every key the type skipped is
//! reported) and [`serde_path_to_error`] (the path of a type error).
//! Types reached through `#[serde(flatten)]` or untagged enums buffer their
//! input, which hides what they skip; the resource and settings types use
//! neither on the way to a person's fields.
//!
//! Every problem carries its field path and the line and column in the
//! file: serde_yaml's own errors have them, and a skipped key is found by a
//! second walk of the document down its path ([`locate`]).

use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Segment {
    /// A mapping key.
    Key(String),
    /// A sequence index.
    Index(usize),
}

/// Where a field is in a document: `spec.jobs[0].requirements`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct FieldPath(pub Vec<Segment>);

impl FieldPath {
    /// The path of `keys`, in order.
    pub fn of(keys: &[&str]) -> Self {
        Self(keys.iter().map(|k| Segment::Key((*k).to_owned())).collect())
    }

    /// This path with `key` appended.
    pub fn key(&self, key: &str) -> Self {
        let mut path = self.clone();
        path.0.push(Segment::Key(key.to_owned()));
        path
    }

    /// This path with `index` appended.
    pub fn index(&self, index: usize) -> Self {
        let mut path = self.clone();
        path.0.push(Segment::Index(index));
        path
    }

    /// Parses the path notation validation messages use (`jobs[1].coLocateWith`).
    pub fn parse(text: &str) -> Self {
        let mut segments = Vec::new();
        for part in text.split('.').filter(|p| !p.is_empty()) {
            let mut rest = part;
            if let Some(open) = rest.find('[') {
                if open > 0 {
                    segments.push(Segment::Key(rest[..open].to_owned()));
                }
                rest = &rest[open..];
                while let Some(stripped) = rest.strip_prefix('[') {
                    let Some(close) = stripped.find(']') else { break };
                    match stripped[..close].parse() {
                        Ok(index) => segments.push(Segment::Index(index)),
                        Err(_) => segments.push(Segment::Key(stripped[..close].to_owned())),
                    }
                    rest = &stripped[close + 1..];
                }
            } else {
                segments.push(Segment::Key(rest.to_owned()));
            }
        }
        Self(segments)
    }

    /// `prefix` followed by this path.
    pub fn under(&self, prefix: &FieldPath) -> Self {
        let mut path = prefix.clone();
        path.0.extend(self.0.iter().cloned());
        path
    }

    fn of_ignored(path: &serde_ignored::Path<'_>) -> Self {
        fn walk(path: &serde_ignored::Path<'_>, out: &mut Vec<Segment>) {
            match path {
                serde_ignored::Path::Root => {}
                serde_ignored::Path::Seq { parent, index } => {
                    walk(parent, out);
                    out.push(Segment::Index(*index));
                }
                serde_ignored::Path::Map { parent, key } => {
                    walk(parent, out);
                    out.push(Segment::Key(key.clone()));
                }
                serde_ignored::Path::Some { parent }
                | serde_ignored::Path::NewtypeStruct { parent }
                | serde_ignored::Path::NewtypeVariant { parent } => walk(parent, out),
            }
        }
        let mut segments = Vec::new();
        walk(path, &mut segments);
        Self(segments)
    }

    fn of_error(path: &serde_path_to_error::Path) -> Self {
        Self(
            path.iter()
                .filter_map(|segment| match segment {
                    serde_path_to_error::Segment::Seq { index } => Some(Segment::Index(*index)),
                    serde_path_to_error::Segment::Map { key } => Some(Segment::Key(key.clone())),
                    serde_path_to_error::Segment::Enum { variant } => Some(Segment::Key(variant.clone())),
                    serde_path_to_error::Segment::Unknown => None,
                })
                .collect(),
        )
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Key(key) if i == 0 => f.write_str(key)?,
                Segment::Key(key) => write!(f, ".{key}")?,
                Segment::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

/// One thing wrong with a document.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// The field (empty for the document as a whole).
    #[serde(serialize_with = "as_text")]
    pub path: FieldPath,
    /// Its line in the file, counting from 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// Its column, counting from 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<usize>,
    /// What is wrong with it.
    pub message: String,
}

fn as_text<S: serde::Serializer>(path: &FieldPath, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(path)
}

impl Problem {
    /// A problem at `path` of document `index` (0-based) of `text`, its
    /// line and column looked up there.
    pub fn at(text: &str, index: usize, path: FieldPath, message: impl Into<String>) -> Self {
        let (line, column) = locate(text, index, &path).unzip();
        Self {
            path,
            line,
            column,
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.path.0.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)?;
        if let (Some(line), Some(column)) = (self.line, self.column) {
            let at = format!("at line {line} column {column}");
            // A YAML syntax error's own words already say where.
            if !self.message.contains(&at) {
                write!(f, " {at}")?;
            }
        }
        Ok(())
    }
}

/// The message of an unknown field.
pub const UNKNOWN_FIELD: &str = "unknown field (not declared for this kind; misspelt?)";

/// Decodes document `index` (0-based) of `text` as a `T`, strictly. Keys
/// at `tolerated` paths are not reported (the `apiVersion` and `kind` a
/// resource type reads elsewhere). On success, the value and every unknown
/// field; on a type error, that error.
pub fn decode_document<T: DeserializeOwned>(
    text: &str,
    index: usize,
    tolerated: &[FieldPath],
) -> Result<(T, Vec<Problem>), Problem> {
    let Some(document) = serde_yaml::Deserializer::from_str(text).nth(index) else {
        return Err(Problem {
            path: FieldPath::default(),
            line: None,
            column: None,
            message: format!("no document {}", index + 1),
        });
    };
    let mut unknown = Vec::new();
    let mut skipped = |path: serde_ignored::Path| unknown.push(FieldPath::of_ignored(&path));
    let decoded: Result<T, _> =
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(document, &mut skipped));
    match decoded {
        Ok(value) => {
            let problems = unknown
                .into_iter()
                .filter(|path| !tolerated.contains(path))
                .map(|path| Problem::at(text, index, path, UNKNOWN_FIELD))
                .collect();
            Ok((value, problems))
        }
        Err(e) => Err(type_problem(FieldPath::of_error(e.path()), e.inner())),
    }
}

/// Decodes a single-document file's `text` as a `T`, refusing unknown
/// fields: the settings files.
pub fn decode<T: DeserializeOwned>(text: &str) -> Result<T, Vec<Problem>> {
    match decode_document(text, 0, &[]) {
        Ok((value, unknown)) if unknown.is_empty() => Ok(value),
        Ok((_, unknown)) => Err(unknown),
        Err(problem) => Err(vec![problem]),
    }
}

/// A serde_yaml error as a problem: its message without the path and
/// position serde_yaml puts around it (they become fields).
fn type_problem(path: FieldPath, error: &serde_yaml::Error) -> Problem {
    let mut message = error.to_string();
    let location = error.location();
    if let Some(at) = &location {
        let suffix = format!(" at line {} column {}", at.line(), at.column());
        if let Some(stripped) = message.strip_suffix(&suffix) {
            message = stripped.to_owned();
        }
    }
    let prefix = format!("{path}: ");
    if let Some(stripped) = message.strip_prefix(&prefix) {
        message = stripped.to_owned();
    }
    Problem {
        path,
        line: location.as_ref().map(serde_yaml::Location::line),
        column: location.as_ref().map(serde_yaml::Location::column),
        message,
    }
}

/// The line and column of `path` in document `index` of `text`: the key
/// of a mapping entry, the element of a sequence. Where the path leaves
/// the document, the nearest enclosing node.
pub fn locate(text: &str, index: usize, path: &FieldPath) -> Option<(usize, usize)> {
    let document = serde_yaml::Deserializer::from_str(text).nth(index)?;
    // The walk always ends in an error: serde_yaml stamps the position of
    // the node being read onto it.
    let error = Locate(&path.0).deserialize(document).err()?;
    error.location().map(|at| (at.line(), at.column()))
}

const FOUND: &str = "found";

struct Locate<'p>(&'p [Segment]);

impl<'de> DeserializeSeed<'de> for Locate<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// A mapping key: stops on the key that ends the path.
struct Key<'p> {
    wanted: &'p str,
    last: bool,
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = bool;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        match (key == self.wanted, self.last) {
            (true, true) => Err(E::custom(FOUND)),
            (matches, _) => Ok(matches),
        }
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
        self.visit_str(&v.to_string())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
        self.visit_str(&v.to_string())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
        self.visit_str(&v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<bool, E> {
        self.visit_str(&v.to_string())
    }

    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}

impl<'de> Visitor<'de> for Locate<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        if let Some((Segment::Key(wanted), rest)) = self.0.split_first() {
            let last = rest.is_empty();
            while let Some(matches) = map.next_key_seed(Key { wanted, last })? {
                if matches {
                    return map.next_value_seed(Locate(rest));
                }
                map.next_value::<IgnoredAny>()?;
            }
        }
        Err(de::Error::custom(FOUND))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if let Some((Segment::Index(wanted), rest)) = self.0.split_first() {
            let mut index = 0;
            loop {
                if index == *wanted {
                    // The element's walk ends in its own error; past the
                    // end, the sequence is the nearest node.
                    seq.next_element_seed(Locate(rest))?;
                    return Err(de::Error::custom(FOUND));
                }
                if seq.next_element::<IgnoredAny>()?.is_none() {
                    break;
                }
                index += 1;
            }
        }
        Err(de::Error::custom(FOUND))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Job {
        job_name: String,
        #[serde(default)]
        requirements: Requirements,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Requirements {
        #[serde(default)]
        required_capacity: f64,
        #[serde(default)]
        on_runtime_failure: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    struct Spec {
        jobs: Vec<Job>,
        #[serde(default)]
        parameters: BTreeMap<String, String>,
    }

    const TEXT: &str = "jobs:\n  - jobName: a\n  - jobName: b\n    requirements:\n      requiredCapacity: 1\n      onRuntimeFaliure: drop\nparameters: {free: form}\n";

    #[test]
    fn an_unknown_field_is_refused_with_its_path_line_and_column() {
        let problems = decode::<Spec>(TEXT).unwrap_err();
        assert_eq!(problems.len(), 1);
        assert_eq!(
            problems[0].to_string(),
            format!("jobs[1].requirements.onRuntimeFaliure: {UNKNOWN_FIELD} at line 6 column 7")
        );
    }

    #[test]
    fn a_map_of_free_keys_accepts_any_key() {
        let fixed = TEXT.replace("onRuntimeFaliure", "onRuntimeFailure");
        let spec = decode::<Spec>(&fixed).unwrap();
        assert_eq!(spec.parameters["free"], "form");
        assert_eq!(spec.jobs[1].job_name, "b");
        assert_eq!(spec.jobs[1].requirements.required_capacity, 1.0);
        assert_eq!(spec.jobs[1].requirements.on_runtime_failure.as_deref(), Some("drop"));
    }

    #[test]
    fn a_type_error_has_its_path_and_position_apart_from_its_message() {
        let problems =
            decode::<Spec>("jobs:\n  - jobName: a\n    requirements: {requiredCapacity: lots}\n").unwrap_err();
        assert_eq!(problems[0].path.to_string(), "jobs[0].requirements.requiredCapacity");
        assert_eq!(problems[0].line, Some(3));
        assert!(
            problems[0].message.starts_with("invalid type: string \"lots\""),
            "{}",
            problems[0].message
        );
        let missing = decode::<Spec>("jobs:\n  - requirements: {}\n").unwrap_err();
        assert_eq!(missing[0].path.to_string(), "jobs[0]");
        assert!(
            missing[0].message.contains("missing field `jobName`"),
            "{}",
            missing[0].message
        );
    }

    #[test]
    fn locate_finds_keys_and_elements_in_later_documents() {
        let text = "a: 1\n---\nx:\n  y: [p, q]\n";
        assert_eq!(locate(text, 1, &FieldPath::parse("x.y[1]")), Some((4, 10)));
        assert_eq!(locate(text, 1, &FieldPath::parse("x.y")), Some((4, 3)));
        assert_eq!(locate(text, 0, &FieldPath::parse("a")), Some((1, 1)));
    }

    #[test]
    fn paths_parse_and_print_in_one_notation() {
        for text in ["jobs[1].coLocateWith", "spec.tiers[0].name", "a[0][1].b"] {
            assert_eq!(FieldPath::parse(text).to_string(), text);
        }
    }
}
