//! The additions, removed from messages. In published mode every message
//! the simulated Manager receives or sends on a published RPC goes through
//! [`strip`], which keeps exactly the fields `proto/published-api.txt` lists
//! for its type, at every depth, and drops all others: an added field
//! (numbered 100 and up in a published message) and an added oneof variant
//! (an added event is left with no event at all). A 1.0.384 Manager neither
//! sends fields it does not have nor sees the ones a newer client sets.
//!
//! The filter reads the wire encoding and the published listing, not the
//! generated structs, so a field added to `manager.proto` is stripped without
//! anyone listing it here. It owns no behaviour: what the simulated world does
//! differently in published mode lives in the world.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use prost::Message;

use crate::manager::proto::{common, manager as pb};

const PUBLISHED: &str = include_str!("../../../proto/published-api.txt");

/// Protobuf wire types (proto3 uses no groups).
const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LENGTH_DELIMITED: u64 = 2;
const FIXED32: u64 = 5;

/// A message of the published API that crosses the simulated Manager's
/// boundary, with the name the published listing gives it.
pub(crate) trait Published: Message + Default {
    /// The fully-qualified protobuf name (`norsk.api.manager.Job`).
    const NAME: &'static str;
}

macro_rules! published {
    ($($ty:ty => $name:literal),* $(,)?) => {
        $(impl Published for $ty {
            const NAME: &'static str = $name;
        })*
    };
}

// The requests and answers of the published RPCs (google.protobuf.Empty,
// `()`, has nothing to strip).
published! {
    pb::Job => "norsk.api.manager.Job",
    pb::JobHash => "norsk.api.manager.JobHash",
    pb::JobSearchRequest => "norsk.api.manager.JobSearchRequest",
    pb::CurrentJob => "norsk.api.manager.CurrentJob",
    pb::CreateAwsNodeRequest => "norsk.api.manager.CreateAwsNodeRequest",
    pb::CreateOciNodeRequest => "norsk.api.manager.CreateOciNodeRequest",
    pb::UpdatePhysicalNodeRequest => "norsk.api.manager.UpdatePhysicalNodeRequest",
    pb::StartJobRequest => "norsk.api.manager.StartJobRequest",
    pb::StopJobRequest => "norsk.api.manager.StopJobRequest",
    pb::EventStreamEvent => "norsk.api.manager.EventStreamEvent",
    pb::NorskStatusEvent => "norsk.api.manager.NorskStatusEvent",
    common::JobId => "norsk.api.common.JobId",
    common::NodeId => "norsk.api.common.NodeId",
}

/// A message whose additions could not be removed. prost only writes
/// well-formed encodings and the filter only drops whole fields, so this
/// means a bug in the filter, reported rather than hidden.
#[derive(Debug, thiserror::Error)]
#[error("failed to remove the additions from a {message}: {why}")]
pub(crate) struct StripError {
    message: &'static str,
    why: String,
}

impl From<StripError> for tonic::Status {
    fn from(e: StripError) -> Self {
        tonic::Status::internal(e.to_string())
    }
}

/// `message` as the published API has it: every field the published
/// listing does not name for its type is gone, at every depth.
pub(crate) fn strip<M: Published>(message: &M) -> Result<M, StripError> {
    let fail = |why: String| StripError { message: M::NAME, why };
    let mut kept = Vec::new();
    keep_published(M::NAME, &message.encode_to_vec(), &mut kept).map_err(fail)?;
    M::decode(kept.as_slice()).map_err(|e| fail(e.to_string()))
}

/// What the published listing says of one message: its field numbers, each
/// with the message type its value is filtered as (`None`: kept as it is:
/// scalars, enums, well-known types, maps of scalars).
type Fields = HashMap<u64, Option<String>>;

/// Every published message by name (a map with message values gets an
/// entry type of its own, `<message>.<field>#entry`).
fn schema() -> &'static HashMap<String, Fields> {
    static SCHEMA: OnceLock<HashMap<String, Fields>> = OnceLock::new();
    SCHEMA.get_or_init(|| parse(PUBLISHED))
}

/// Reads the `field <message> <number> <name> <type>[ oneof=<group>]` lines.
/// A line it could not read would lose a published field; the listing is
/// held to the compiled proto by `tests/simulator/proto_compat.rs`, and the
/// tests below fail on any published field lost.
fn parse(listing: &str) -> HashMap<String, Fields> {
    let enums: HashSet<&str> = listing
        .lines()
        .filter_map(|line| line.strip_prefix("enum ")?.split(' ').next())
        .collect();
    // A message of the API is filtered in turn; an enum or a well-known
    // type (google.protobuf.Timestamp) is a value like a scalar.
    let filtered = |ty: &str| {
        ty.strip_prefix('.')
            .filter(|name| name.starts_with("norsk.") && !enums.contains(name))
            .map(str::to_owned)
    };
    let mut messages: HashMap<String, Fields> = HashMap::new();
    for line in listing.lines() {
        let Some(rest) = line.strip_prefix("field ") else {
            continue;
        };
        let mut words = rest.splitn(4, ' ');
        let (Some(message), Some(Ok(number)), Some(name), Some(ty)) = (
            words.next(),
            words.next().map(str::parse::<u64>),
            words.next(),
            words.next(),
        ) else {
            continue;
        };
        let ty = ty.split_once(" oneof=").map_or(ty, |(ty, _)| ty);
        let ty = ty.strip_prefix("repeated ").unwrap_or(ty);
        let nested = match ty.strip_prefix("map<").and_then(|m| m.strip_suffix('>')) {
            Some(map) => map.split_once(',').and_then(|(_, value)| filtered(value)).map(|value| {
                let entry = format!("{message}.{name}#entry");
                messages.insert(entry.clone(), HashMap::from([(1, None), (2, Some(value))]));
                entry
            }),
            None => filtered(ty),
        };
        messages.entry(message.to_owned()).or_default().insert(number, nested);
    }
    messages
}

/// Copies the fields of `input` (an encoded `message`) that the published
/// listing names to `out`, filtering nested messages the same way. A
/// published message the listing names no field of (`OciMetadata`) keeps
/// none.
fn keep_published(message: &str, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let fields = schema().get(message);
    while !input.is_empty() {
        let field_start = input;
        let key = read_varint(&mut input)?;
        let (number, wire_type) = (key >> 3, key & 7);
        let length = match wire_type {
            VARINT => {
                let mut value = input;
                read_varint(&mut value)?;
                input.len() - value.len()
            }
            FIXED64 => 8,
            LENGTH_DELIMITED => usize::try_from(read_varint(&mut input)?)
                .map_err(|_| format!("field {number} of {message} is longer than memory"))?,
            FIXED32 => 4,
            other => return Err(format!("field {number} of {message} has wire type {other}, not proto3")),
        };
        let (value, rest) = input
            .split_at_checked(length)
            .ok_or_else(|| format!("field {number} of {message} is cut short"))?;
        input = rest;
        match fields.and_then(|fields| fields.get(&number)) {
            // An addition: not in the published API.
            None => {}
            Some(Some(nested)) if wire_type == LENGTH_DELIMITED => {
                let mut kept = Vec::new();
                keep_published(nested, value, &mut kept)?;
                write_varint(key, out);
                write_varint(kept.len() as u64, out);
                out.extend_from_slice(&kept);
            }
            Some(_) => out.extend_from_slice(&field_start[..field_start.len() - input.len()]),
        }
    }
    Ok(())
}

fn read_varint(input: &mut &[u8]) -> Result<u64, String> {
    let bytes: &[u8] = input;
    let mut value = 0u64;
    for (i, byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *input = &bytes[i + 1..];
            return Ok(value);
        }
    }
    Err("a varint is cut short or longer than ten bytes".to_owned())
}

fn write_varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use prost_types::field_descriptor_proto::Type;
    use prost_types::{DescriptorProto, FileDescriptorSet};

    use super::*;
    use crate::manager::proto::DESCRIPTOR_SET;
    use crate::manager::proto::manager::{event_stream_event::Event, job_history_entry::HistoryEntry};

    /// Nested messages deeper than this are left unset when populating.
    const DEPTH: usize = 10;

    /// The compiled `proto/`, by fully-qualified name (no leading dot).
    struct Compiled(HashMap<String, DescriptorProto>);

    impl Compiled {
        fn load() -> Self {
            fn collect(prefix: &str, msg: &DescriptorProto, all: &mut HashMap<String, DescriptorProto>) {
                let name = format!("{prefix}.{}", msg.name());
                for nested in &msg.nested_type {
                    collect(&name, nested, all);
                }
                all.insert(name, msg.clone());
            }
            let set = FileDescriptorSet::decode(DESCRIPTOR_SET).unwrap();
            let mut all = HashMap::new();
            for file in &set.file {
                for msg in &file.message_type {
                    collect(file.package(), msg, &mut all);
                }
            }
            Self(all)
        }

        /// The largest oneof: populating with every choice index up to it
        /// sets every variant of every oneof once.
        fn widest_oneof(&self) -> usize {
            self.0
                .values()
                .flat_map(|m| (0..m.oneof_decl.len()).map(move |i| oneof_members(m, i as i32).len()))
                .max()
                .unwrap_or(1)
        }

        /// An encoded `message` with every field set to a non-default value,
        /// down to [`DEPTH`]; of each oneof only member `choice` (modulo its
        /// size) is set, as a decoder keeps one.
        fn populate(&self, message: &str, choice: usize, depth: usize) -> Vec<u8> {
            let mut out = Vec::new();
            let Some(msg) = self.0.get(message) else {
                return out; // a well-known type compiled elsewhere: left empty
            };
            for field in &msg.field {
                if let Some(oneof) = field.oneof_index.filter(|_| !field.proto3_optional()) {
                    let members = oneof_members(msg, oneof);
                    if members[choice % members.len()] != field.number() {
                        continue;
                    }
                }
                let key = |wire_type: u64| ((field.number() as u64) << 3) | wire_type;
                match field.r#type() {
                    Type::Message | Type::Group => {
                        if depth == 0 {
                            continue;
                        }
                        let nested = self.populate(field.type_name().trim_start_matches('.'), choice, depth - 1);
                        write_varint(key(LENGTH_DELIMITED), &mut out);
                        write_varint(nested.len() as u64, &mut out);
                        out.extend_from_slice(&nested);
                    }
                    Type::String | Type::Bytes => {
                        write_varint(key(LENGTH_DELIMITED), &mut out);
                        write_varint(1, &mut out);
                        out.push(b'x');
                    }
                    Type::Double | Type::Fixed64 | Type::Sfixed64 => {
                        write_varint(key(FIXED64), &mut out);
                        out.extend_from_slice(&1.0f64.to_le_bytes());
                    }
                    Type::Float | Type::Fixed32 | Type::Sfixed32 => {
                        write_varint(key(FIXED32), &mut out);
                        out.extend_from_slice(&1.0f32.to_le_bytes());
                    }
                    _ => {
                        write_varint(key(VARINT), &mut out);
                        write_varint(1, &mut out);
                    }
                }
            }
            out
        }

        /// Every field present in an encoded `message`, as the path of
        /// `message.number` steps that leads to it.
        fn paths(&self, message: &str, mut input: &[u8], prefix: &str, found: &mut BTreeSet<String>) {
            let msg = &self.0[message];
            while !input.is_empty() {
                let key = read_varint(&mut input).unwrap();
                let (number, wire_type) = (key >> 3, key & 7);
                let length = match wire_type {
                    VARINT => {
                        let mut value = input;
                        read_varint(&mut value).unwrap();
                        input.len() - value.len()
                    }
                    FIXED64 => 8,
                    LENGTH_DELIMITED => read_varint(&mut input).unwrap() as usize,
                    _ => 4,
                };
                let (value, rest) = input.split_at(length);
                input = rest;
                let path = format!("{prefix}/{message}.{number}");
                let field = msg.field.iter().find(|f| f.number() as u64 == number);
                if let Some(field) = field.filter(|f| f.r#type() == Type::Message) {
                    let nested = field.type_name().trim_start_matches('.');
                    if self.0.contains_key(nested) {
                        self.paths(nested, value, &path, found);
                    }
                }
                found.insert(path);
            }
        }

        fn is_map_entry(&self, message: &str) -> bool {
            self.0[message].options.as_ref().is_some_and(|o| o.map_entry())
        }
    }

    fn oneof_members(msg: &DescriptorProto, oneof: i32) -> Vec<i32> {
        msg.field
            .iter()
            .filter(|f| f.oneof_index == Some(oneof) && !f.proto3_optional())
            .map(|f| f.number())
            .collect()
    }

    /// `message.number` steps the published listing names.
    fn published_steps() -> BTreeSet<String> {
        PUBLISHED
            .lines()
            .filter_map(|line| {
                let mut words = line.strip_prefix("field ")?.split(' ');
                Some(format!("{}.{}", words.next()?, words.next()?))
            })
            .collect()
    }

    /// Checks `M` with every oneof choice: decoding a fully populated
    /// encoding keeps every field (so `M` is the message `M::NAME` names),
    /// and stripping keeps exactly the fields whose every step is published.
    fn check<M: Published>(compiled: &Compiled, published: &BTreeSet<String>) {
        let is_published = |path: &str| {
            path.split('/').skip(1).all(|step| {
                let message = step.rsplit_once('.').map_or(step, |(m, _)| m);
                // Well-known types (google.protobuf.Timestamp) and map
                // entries are whole values of a published field.
                !message.starts_with("norsk.") || compiled.is_map_entry(message) || published.contains(step)
            })
        };
        for choice in 0..compiled.widest_oneof() {
            let populated = compiled.populate(M::NAME, choice, DEPTH);
            let decoded = M::decode(populated.as_slice()).unwrap();
            let mut all = BTreeSet::new();
            compiled.paths(M::NAME, &populated, "", &mut all);
            let mut round_tripped = BTreeSet::new();
            compiled.paths(M::NAME, &decoded.encode_to_vec(), "", &mut round_tripped);
            assert_eq!(round_tripped, all, "{} does not decode every field", M::NAME);

            let mut kept = BTreeSet::new();
            compiled.paths(M::NAME, &strip(&decoded).unwrap().encode_to_vec(), "", &mut kept);
            let expected: BTreeSet<String> = all.iter().filter(|p| is_published(p)).cloned().collect();
            let leaked: Vec<_> = kept.difference(&expected).collect();
            assert!(leaked.is_empty(), "additions left in {}: {leaked:?}", M::NAME);
            let lost: Vec<_> = expected.difference(&kept).collect();
            assert!(lost.is_empty(), "published fields lost from {}: {lost:?}", M::NAME);
        }
    }

    #[test]
    fn stripping_keeps_exactly_the_published_fields_of_every_message_that_crosses_the_boundary() {
        let compiled = Compiled::load();
        let published = published_steps();
        check::<pb::Job>(&compiled, &published);
        check::<pb::JobHash>(&compiled, &published);
        check::<pb::JobSearchRequest>(&compiled, &published);
        check::<pb::CurrentJob>(&compiled, &published);
        check::<pb::CreateAwsNodeRequest>(&compiled, &published);
        check::<pb::CreateOciNodeRequest>(&compiled, &published);
        check::<pb::UpdatePhysicalNodeRequest>(&compiled, &published);
        check::<pb::StartJobRequest>(&compiled, &published);
        check::<pb::StopJobRequest>(&compiled, &published);
        check::<pb::EventStreamEvent>(&compiled, &published);
        check::<pb::NorskStatusEvent>(&compiled, &published);
        check::<common::JobId>(&compiled, &published);
        check::<common::NodeId>(&compiled, &published);
    }

    #[test]
    fn the_check_sees_additions_in_a_populated_message() {
        // Guards the check above against passing vacuously: a populated
        // event does carry additions (an added variant, a job's 100+ fields).
        let compiled = Compiled::load();
        let published = published_steps();
        let mut steps = BTreeSet::new();
        for choice in 0..compiled.widest_oneof() {
            let populated = compiled.populate(pb::EventStreamEvent::NAME, choice, DEPTH);
            compiled.paths(pb::EventStreamEvent::NAME, &populated, "", &mut steps);
        }
        let unpublished = |needle: &str| steps.iter().any(|p| p.ends_with(needle) && !published.contains(needle));
        assert!(unpublished("norsk.api.manager.EventStreamEvent.102"), "node_inventory");
        assert!(unpublished("norsk.api.manager.Job.100"), "Job.bundle_ref");
    }

    #[test]
    fn an_added_event_is_left_empty_and_a_job_keeps_only_its_published_fields() {
        let inventory = pb::EventStreamEvent {
            event: Some(Event::NodeInventory(pb::NodeInventoryUpdated::default())),
        };
        assert_eq!(strip(&inventory).unwrap().event, None);

        let published_job = pb::Job {
            job_id: Some(common::JobId { job_id: "j1".into() }),
            description: "encode".into(),
            tags: [("pool".to_owned(), "studio".to_owned())].into(),
            state: pb::job::JobState::Active as i32,
            ..Default::default()
        };
        let with_additions = pb::Job {
            bundle_ref: Some(pb::BundleJobRef::default()),
            template: "encoder".into(),
            dormant: true,
            parameters: [("bitrate".to_owned(), "6M".to_owned())].into(),
            ..published_job.clone()
        };
        let updated = |job: pb::Job| pb::EventStreamEvent {
            event: Some(Event::JobUpdated(pb::JobUpdated {
                job_with_history: Some(pb::JobWithHistory {
                    job: Some(job.clone()),
                    history_entry: vec![pb::JobHistoryEntry {
                        history_entry: Some(HistoryEntry::JobUpdated(pb::JobHistoryJobUpdated {
                            timestamp: Some(prost_types::Timestamp { seconds: 7, nanos: 0 }),
                            previous_job: Some(job),
                        })),
                    }],
                }),
            })),
        };
        assert_eq!(strip(&updated(with_additions)).unwrap(), updated(published_job.clone()));
        assert_eq!(strip(&published_job).unwrap(), published_job);

        let start = pb::StartJobRequest {
            role: "primary".into(),
            gpu_index: Some(1),
            defer_start: true,
            runtime_role: "backup".into(),
            migration_id: "m1".into(),
            ..Default::default()
        };
        assert_eq!(
            strip(&start).unwrap(),
            pb::StartJobRequest {
                role: "primary".into(),
                ..Default::default()
            }
        );
    }
}
