//! Resource documents: multi-document YAML of the kinds the operator
//! reconciles, decoded exactly as strictly as the API server admits them —
//! `apiVersion` and `kind`, a valid `metadata.name` (and namespace), the
//! typed shape with unknown fields refused ([`super::strict`]), the
//! schema's value constraints ([`super::schema`]) and the CEL rules that
//! need no fleet ([`super::rules`]). What needs the pools or the fleet
//! (a bundle's pool, a pool set as a whole) is checked where it is
//! applied, as the operator reports it on the resource's status.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

use serde::de::DeserializeOwned;

use super::rules;
use super::schema;
use super::strict::{FieldPath, Problem, decode_document};
use crate::crd::{self, API_VERSION, DEFAULT_NAMESPACE};

/// The kinds of resource documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `PlacementPool` (cluster-scoped).
    PlacementPool,
    /// `HotSparePolicy` (cluster-scoped).
    HotSparePolicy,
    /// `Bundle` (namespaced).
    Bundle,
    /// `NorskNode` (cluster-scoped).
    NorskNode,
    /// `NodeDrain` (cluster-scoped).
    NodeDrain,
    /// `JobMigration` (namespaced).
    JobMigration,
}

impl Kind {
    /// Every kind, in the order they are applied.
    pub const ALL: [Kind; 6] = [
        Kind::PlacementPool,
        Kind::HotSparePolicy,
        Kind::Bundle,
        Kind::NorskNode,
        Kind::NodeDrain,
        Kind::JobMigration,
    ];

    /// The `kind` of its documents.
    pub fn name(self) -> &'static str {
        match self {
            Kind::PlacementPool => "PlacementPool",
            Kind::HotSparePolicy => "HotSparePolicy",
            Kind::Bundle => "Bundle",
            Kind::NorskNode => "NorskNode",
            Kind::NodeDrain => "NodeDrain",
            Kind::JobMigration => "JobMigration",
        }
    }

    fn of(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether its resources live in a namespace.
    pub fn namespaced(self) -> bool {
        matches!(self, Kind::Bundle | Kind::JobMigration)
    }

    /// Its CRD's `openAPIV3Schema` as JSON, as `crds/` installs it.
    fn schema(self) -> &'static serde_json::Value {
        static SCHEMAS: OnceLock<BTreeMap<String, serde_json::Value>> = OnceLock::new();
        let schemas = SCHEMAS.get_or_init(|| {
            crd::definitions()
                .into_iter()
                .filter_map(|definition| {
                    let schema = definition
                        .spec
                        .versions
                        .first()?
                        .schema
                        .as_ref()?
                        .open_api_v3_schema
                        .as_ref()?;
                    Some((definition.spec.names.kind.clone(), serde_json::to_value(schema).ok()?))
                })
                .collect()
        });
        static EMPTY: serde_json::Value = serde_json::Value::Null;
        schemas.get(self.name()).unwrap_or(&EMPTY)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One resource document, typed (boxed: the kinds differ much in size).
#[derive(Clone, Debug)]
pub enum Resource {
    /// A pool.
    PlacementPool(Box<crd::PlacementPool>),
    /// One pool's hot spares.
    HotSparePolicy(Box<crd::HotSparePolicy>),
    /// A bundle.
    Bundle(Box<crd::Bundle>),
    /// What people set on a node (cordon, spare spec).
    NorskNode(Box<crd::NorskNode>),
    /// A drain.
    NodeDrain(Box<crd::NodeDrain>),
    /// A migration.
    JobMigration(Box<crd::JobMigration>),
}

/// A kind's resource type, as a [`Resource`] holds it.
pub trait OfKind: Sized {
    /// The resource, when it is of this kind.
    fn of(resource: &Resource) -> Option<&Self>;
}

macro_rules! of_kind {
    ($($kind:ident),*) => {
        $(impl OfKind for crd::$kind {
            fn of(resource: &Resource) -> Option<&Self> {
                match resource {
                    Resource::$kind(r) => Some(r),
                    _ => None,
                }
            }
        })*
    };
}

of_kind!(
    PlacementPool,
    HotSparePolicy,
    Bundle,
    NorskNode,
    NodeDrain,
    JobMigration
);

/// Names one resource: its kind, its namespace (namespaced kinds; `default`
/// when a document names none, as `kubectl apply` puts it there) and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceKey {
    pub kind: Kind,
    /// The namespace of a namespaced kind.
    pub namespace: Option<String>,
    pub name: String,
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(namespace) => write!(f, "{} {namespace}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

impl Resource {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Resource::PlacementPool(_) => Kind::PlacementPool,
            Resource::HotSparePolicy(_) => Kind::HotSparePolicy,
            Resource::Bundle(_) => Kind::Bundle,
            Resource::NorskNode(_) => Kind::NorskNode,
            Resource::NodeDrain(_) => Kind::NodeDrain,
            Resource::JobMigration(_) => Kind::JobMigration,
        }
    }

    fn meta(&self) -> &kube::api::ObjectMeta {
        match self {
            Resource::PlacementPool(r) => &r.metadata,
            Resource::HotSparePolicy(r) => &r.metadata,
            Resource::Bundle(r) => &r.metadata,
            Resource::NorskNode(r) => &r.metadata,
            Resource::NodeDrain(r) => &r.metadata,
            Resource::JobMigration(r) => &r.metadata,
        }
    }

    /// Whether `other` asks for the same: the same kind, name and spec
    /// (labels and annotations change nothing applied).
    pub fn same_spec(&self, other: &Resource) -> bool {
        self.key() == other.key()
            && match (self, other) {
                (Resource::PlacementPool(a), Resource::PlacementPool(b)) => a.spec == b.spec,
                (Resource::HotSparePolicy(a), Resource::HotSparePolicy(b)) => a.spec == b.spec,
                (Resource::Bundle(a), Resource::Bundle(b)) => a.spec == b.spec,
                (Resource::NorskNode(a), Resource::NorskNode(b)) => a.spec == b.spec,
                (Resource::NodeDrain(a), Resource::NodeDrain(b)) => a.spec == b.spec,
                (Resource::JobMigration(a), Resource::JobMigration(b)) => a.spec == b.spec,
                _ => false,
            }
    }

    /// Its key.
    pub fn key(&self) -> ResourceKey {
        let kind = self.kind();
        let meta = self.meta();
        ResourceKey {
            kind,
            namespace: kind
                .namespaced()
                .then(|| meta.namespace.clone().unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned())),
            name: meta.name.clone().unwrap_or_default(),
        }
    }
}

/// One decoded document of a file.
#[derive(Clone, Debug)]
pub struct Document {
    /// Its place in the file, counting from 0.
    pub index: usize,
    /// What it holds.
    pub resource: Resource,
}

/// Why a document was refused: every problem found in it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DocumentError {
    /// The document, counting from 1.
    pub document: usize,
    /// The resource it names, as far as it could be read
    /// (`Bundle default/ch1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// What is wrong, each with its field path, line and column.
    pub problems: Vec<Problem>,
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.document)?;
        if let Some(resource) = &self.resource {
            write!(f, " ({resource})")?;
        }
        let problems: Vec<String> = self.problems.iter().map(ToString::to_string).collect();
        write!(f, ": {}", problems.join("; "))
    }
}

/// Decodes every non-empty document of `text` as one of `kinds`. All or
/// nothing: every refused document is listed, with every problem in it.
pub fn decode_file(text: &str, kinds: &[Kind]) -> Result<Vec<Document>, Vec<DocumentError>> {
    let mut documents = Vec::new();
    let mut errors = Vec::new();
    let mut seen: BTreeMap<ResourceKey, usize> = BTreeMap::new();
    for (index, document) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let value = match serde::Deserialize::deserialize(document) {
            Ok(value) => value,
            Err(e) => {
                // YAML that does not parse ends the stream: nothing after it
                // can be read.
                errors.push(DocumentError {
                    document: index + 1,
                    resource: None,
                    problems: vec![syntax_problem(&e)],
                });
                break;
            }
        };
        match decode_value(text, index, &value, kinds) {
            Ok(None) => {}
            Ok(Some(resource)) => {
                let key = resource.key();
                if let Some(first) = seen.insert(key.clone(), index) {
                    errors.push(DocumentError {
                        document: index + 1,
                        resource: Some(key.to_string()),
                        problems: vec![Problem::at(
                            text,
                            index,
                            FieldPath::of(&["metadata", "name"]),
                            format!("{key} is already defined by document {} of this file", first + 1),
                        )],
                    });
                    continue;
                }
                documents.push(Document { index, resource });
            }
            Err(error) => errors.push(error),
        }
    }
    if errors.is_empty() { Ok(documents) } else { Err(errors) }
}

fn syntax_problem(error: &yaml_serde::Error) -> Problem {
    let location = error.location();
    Problem {
        path: FieldPath::default(),
        line: location.as_ref().map(yaml_serde::Location::line),
        column: location.as_ref().map(yaml_serde::Location::column),
        message: format!("not valid YAML: {error}"),
    }
}

/// The resource a document's plain value names, for messages.
fn named(value: &yaml_serde::Value) -> Option<String> {
    let kind = value.get("kind")?.as_str()?;
    let metadata = value.get("metadata")?;
    let name = metadata.get("name")?.as_str()?;
    Some(
        match (Kind::of(kind), metadata.get("namespace").and_then(|n| n.as_str())) {
            (Some(k), namespace) if k.namespaced() => {
                format!("{kind} {}/{name}", namespace.unwrap_or(DEFAULT_NAMESPACE))
            }
            _ => format!("{kind} {name}"),
        },
    )
}

/// One document: none when empty.
fn decode_value(
    text: &str,
    index: usize,
    value: &yaml_serde::Value,
    kinds: &[Kind],
) -> Result<Option<Resource>, DocumentError> {
    if value.is_null() {
        return Ok(None);
    }
    let refused = |problems: Vec<Problem>| DocumentError {
        document: index + 1,
        resource: named(value),
        problems,
    };
    let at = |path: FieldPath, message: String| Problem::at(text, index, path, message);
    let kind = type_of(value, kinds).map_err(|(field, message)| refused(vec![at(FieldPath::of(&[field]), message)]))?;
    let decoded = match kind {
        Kind::PlacementPool => typed(text, index, |r| Resource::PlacementPool(Box::new(r))),
        Kind::HotSparePolicy => typed(text, index, |r| Resource::HotSparePolicy(Box::new(r))),
        Kind::Bundle => typed(text, index, |r| Resource::Bundle(Box::new(r))),
        Kind::NorskNode => typed(text, index, |r| Resource::NorskNode(Box::new(r))),
        Kind::NodeDrain => typed(text, index, |r| Resource::NodeDrain(Box::new(r))),
        Kind::JobMigration => typed(text, index, |r| Resource::JobMigration(Box::new(r))),
    };
    let (resource, mut problems) = decoded.map_err(|problem| refused(vec![problem]))?;
    for (path, message) in rules::metadata(kind, resource.meta()) {
        problems.push(at(path, message));
    }
    match serde_json::to_value(value) {
        Ok(json) => {
            for (path, message) in schema::violations(kind.schema(), &json, &FieldPath::default()) {
                problems.push(at(path, message));
            }
        }
        Err(e) => problems.push(at(FieldPath::default(), format!("not representable as JSON: {e}"))),
    }
    for (path, message) in rules::of(&resource) {
        problems.push(at(path, message));
    }
    if problems.is_empty() {
        Ok(Some(resource))
    } else {
        Err(refused(problems))
    }
}

fn typed<K: DeserializeOwned>(
    text: &str,
    index: usize,
    wrap: fn(K) -> Resource,
) -> Result<(Resource, Vec<Problem>), Problem> {
    // `apiVersion` and `kind` are checked on their own (the typed roots
    // do not hold them).
    let tolerated = [FieldPath::of(&["apiVersion"]), FieldPath::of(&["kind"])];
    decode_document::<K>(text, index, &tolerated).map(|(resource, problems)| (wrap(resource), problems))
}

fn type_of(value: &yaml_serde::Value, kinds: &[Kind]) -> Result<Kind, (&'static str, String)> {
    let field = |name: &str| value.get(name).and_then(yaml_serde::Value::as_str);
    match field("apiVersion") {
        Some(API_VERSION) => {}
        Some(other) => return Err(("apiVersion", format!("expected {API_VERSION}, found {other:?}"))),
        None => return Err(("apiVersion", format!("missing (expected {API_VERSION})"))),
    }
    let expected = || kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(" or ");
    match field("kind") {
        Some(found) => match Kind::of(found).filter(|k| kinds.contains(k)) {
            Some(kind) => Ok(kind),
            None => Err(("kind", format!("expected {}, found {found:?}", expected()))),
        },
        None => Err(("kind", format!("missing (expected {})", expected()))),
    }
}

/// The transition rules the API server checks on an update (`oldSelf`):
/// what may not change between the `old` and `new` version of one
/// resource.
pub fn update_problems(text: &str, document: &Document, old: &Resource) -> Vec<Problem> {
    rules::update(old, &document.resource)
        .into_iter()
        .map(|(path, message)| Problem::at(text, document.index, path, message))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUNDLE: &str = "apiVersion: automanager.norsk.video/v1alpha1
kind: Bundle
metadata: {name: ch1}
spec:
  pool: production
  jobs:
    - jobName: encode
      requirements:
        requiredCapacity: 1
        onRuntimeFaliure: drop
";

    fn one(text: &str, kinds: &[Kind]) -> Result<Resource, DocumentError> {
        decode_file(text, kinds)
            .map(|mut d| d.remove(0).resource)
            .map_err(|mut e| e.remove(0))
    }

    #[test]
    fn a_misspelt_field_refuses_the_document_with_its_path_and_line() {
        let error = one(BUNDLE, &Kind::ALL).unwrap_err();
        assert_eq!(error.document, 1);
        assert_eq!(error.resource.as_deref(), Some("Bundle default/ch1"));
        assert_eq!(error.problems.len(), 1);
        let problem = &error.problems[0];
        assert_eq!(problem.path.to_string(), "spec.jobs[0].requirements.onRuntimeFaliure");
        assert_eq!((problem.line, problem.column), (Some(10), Some(9)));
    }

    #[test]
    fn the_spelt_field_decodes_and_keeps_its_value() {
        let fixed = BUNDLE.replace("Faliure", "Failure");
        let Resource::Bundle(bundle) = one(&fixed, &Kind::ALL).unwrap() else {
            panic!("a bundle")
        };
        assert_eq!(bundle.bundle_id().as_str(), "default/ch1");
        assert_eq!(
            bundle.spec.0.jobs[0].requirements.on_runtime_failure,
            crate::model::OnRuntimeFailure::Drop
        );
    }

    #[test]
    fn schema_bounds_and_names_are_checked_as_the_api_server_does() {
        let drain = "apiVersion: automanager.norsk.video/v1alpha1\nkind: NodeDrain\nmetadata: {name: Drain_1}\nspec: {nodeId: n1, timeoutSeconds: 0}\n";
        let error = one(drain, &Kind::ALL).unwrap_err();
        let paths: Vec<String> = error.problems.iter().map(|p| p.path.to_string()).collect();
        assert_eq!(paths, ["metadata.name", "spec.timeoutSeconds"], "{error}");
        assert_eq!(error.problems[1].line, Some(4));
    }

    #[test]
    fn a_kind_not_taken_here_is_refused() {
        let error = one(BUNDLE, &[Kind::PlacementPool]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "document 1 (Bundle default/ch1): kind: expected PlacementPool, found \"Bundle\" at line 2 column 1"
        );
    }

    proptest::proptest! {
        /// Whatever a person's editor leaves in a file, reading it refuses
        /// or accepts; it never panics, and a refusal says where.
        #[test]
        fn an_edited_document_is_refused_or_accepted_never_a_panic(
            at in 0usize..400,
            inserted in "[ -~\n\t]{0,12}",
        ) {
            let mut text = BUNDLE.to_owned();
            let at = (0..=at.min(text.len())).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
            text.insert_str(at, &inserted);
            if let Err(errors) = decode_file(&text, &Kind::ALL) {
                proptest::prop_assert!(errors.iter().all(|e| e.document >= 1 && !e.problems.is_empty()));
            }
        }
    }

    #[test]
    fn every_bad_document_is_listed_and_a_duplicate_is_one() {
        let good = BUNDLE.replace("Faliure", "Failure");
        let text = format!("{good}---\n{BUNDLE}---\n{good}");
        let errors = decode_file(&text, &Kind::ALL).unwrap_err();
        let numbers: Vec<usize> = errors.iter().map(|e| e.document).collect();
        assert_eq!(numbers, [2, 3]);
        assert!(
            errors[1].to_string().contains("already defined by document 1"),
            "{}",
            errors[1]
        );
    }
}
