//! The wire contract: `proto/` must stay compatible with the published Norsk
//! Manager API. The compiled descriptors are rendered line by line and
//! compared with `proto/published-api.txt` (generated from the published
//! reference), so a renumbered, retyped, renamed or regrouped field, a
//! changed enum value or RPC signature fails here.

use std::collections::{BTreeSet, HashMap};

use norsk_auto_manager::manager::proto::DESCRIPTOR_SET;
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};

/// Where the additions start: published messages may only gain fields from
/// here on.
const FIRST_ADDITION_FIELD: i32 = 100;

struct Compiled {
    lines: BTreeSet<String>,
    /// message fqn -> field numbers.
    fields: HashMap<String, Vec<i32>>,
}

fn published() -> BTreeSet<String> {
    include_str!("../../proto/published-api.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

fn scalar(t: Type) -> &'static str {
    match t {
        Type::Double => "double",
        Type::Float => "float",
        Type::Int64 => "int64",
        Type::Uint64 => "uint64",
        Type::Int32 => "int32",
        Type::Fixed64 => "fixed64",
        Type::Fixed32 => "fixed32",
        Type::Bool => "bool",
        Type::String => "string",
        Type::Bytes => "bytes",
        Type::Uint32 => "uint32",
        Type::Sfixed32 => "sfixed32",
        Type::Sfixed64 => "sfixed64",
        Type::Sint32 => "sint32",
        Type::Sint64 => "sint64",
        Type::Group | Type::Message | Type::Enum => unreachable!("not a scalar"),
    }
}

fn compile() -> Compiled {
    let set = FileDescriptorSet::decode(DESCRIPTOR_SET).expect("descriptor set decodes");
    // Every message by fully-qualified name, to resolve map entries.
    let mut all: HashMap<String, DescriptorProto> = HashMap::new();
    fn collect(prefix: &str, msg: &DescriptorProto, all: &mut HashMap<String, DescriptorProto>) {
        let fqn = format!("{prefix}.{}", msg.name());
        for nested in &msg.nested_type {
            collect(&fqn, nested, all);
        }
        all.insert(fqn, msg.clone());
    }
    for file in &set.file {
        for msg in &file.message_type {
            collect(&format!(".{}", file.package()), msg, &mut all);
        }
    }
    let type_of = |f: &prost_types::FieldDescriptorProto| -> String {
        match f.r#type() {
            Type::Message | Type::Enum | Type::Group => f.type_name().to_owned(),
            t => scalar(t).to_owned(),
        }
    };
    let mut lines = BTreeSet::new();
    let mut fields = HashMap::new();
    for (fqn, msg) in &all {
        if msg.options.as_ref().is_some_and(|o| o.map_entry()) {
            continue;
        }
        let name = fqn.trim_start_matches('.');
        for f in &msg.field {
            let mut ty = type_of(f);
            if f.label() == Label::Repeated {
                let entry = all
                    .get(f.type_name())
                    .filter(|m| m.options.as_ref().is_some_and(|o| o.map_entry()));
                ty = match entry {
                    Some(entry) => format!("map<{},{}>", type_of(&entry.field[0]), type_of(&entry.field[1])),
                    None => format!("repeated {ty}"),
                };
            }
            let oneof = match f.oneof_index {
                Some(i) if !f.proto3_optional() => format!(" oneof={}", msg.oneof_decl[i as usize].name()),
                _ => String::new(),
            };
            lines.insert(format!("field {name} {} {} {ty}{oneof}", f.number(), f.name()));
            fields.entry(name.to_owned()).or_insert_with(Vec::new).push(f.number());
        }
        for e in &msg.enum_type {
            for v in &e.value {
                lines.insert(format!("enum {name}.{} {} {}", e.name(), v.number(), v.name()));
            }
        }
    }
    for file in &set.file {
        for e in &file.enum_type {
            for v in &e.value {
                lines.insert(format!(
                    "enum {}.{} {} {}",
                    file.package(),
                    e.name(),
                    v.number(),
                    v.name()
                ));
            }
        }
        for svc in &file.service {
            for m in &svc.method {
                let stream = if m.server_streaming() { " stream" } else { "" };
                let client = if m.client_streaming() { " client-stream" } else { "" };
                lines.insert(format!(
                    "rpc {}.{}.{} {} -> {}{stream}{client}",
                    file.package(),
                    svc.name(),
                    m.name(),
                    m.input_type(),
                    m.output_type()
                ));
            }
        }
    }
    Compiled { lines, fields }
}

#[test]
fn every_published_field_enum_value_and_rpc_is_compiled_unchanged() {
    let compiled = compile();
    let missing: Vec<_> = published()
        .into_iter()
        .filter(|l| !compiled.lines.contains(l))
        .collect();
    assert!(
        missing.is_empty(),
        "published API lines missing or changed in proto/:\n{}",
        missing.join("\n")
    );
}

#[test]
fn published_messages_gain_fields_only_in_the_addition_range() {
    let compiled = compile();
    let published = published();
    let mut intruders = Vec::new();
    for (msg, numbers) in &compiled.fields {
        let prefix = format!("field {msg} ");
        if !published.iter().any(|l| l.starts_with(&prefix)) {
            continue; // an added message: any numbering is ours
        }
        for n in numbers.iter().filter(|n| **n < FIRST_ADDITION_FIELD) {
            if !published.iter().any(|l| l.starts_with(&format!("{prefix}{n} "))) {
                intruders.push(format!("{msg} field {n}"));
            }
        }
    }
    assert!(
        intruders.is_empty(),
        "fields added below {FIRST_ADDITION_FIELD} in published messages: {intruders:?}"
    );
}

#[test]
fn published_enums_gain_no_values_and_published_services_no_changed_rpcs() {
    let compiled = compile();
    let published = published();
    let published_enums: BTreeSet<String> = published
        .iter()
        .filter_map(|l| {
            l.strip_prefix("enum ")
                .map(|r| r.split(' ').next().unwrap_or_default().to_owned())
        })
        .collect();
    let extra: Vec<_> = compiled
        .lines
        .iter()
        .filter(|l| {
            l.strip_prefix("enum ")
                .is_some_and(|r| published_enums.contains(r.split(' ').next().unwrap_or_default()))
        })
        .filter(|l| !published.contains(*l))
        .collect();
    assert!(extra.is_empty(), "values added to published enums: {extra:?}");
}

#[test]
fn the_check_itself_notices_a_renumbered_field() {
    // Guard against a comparison that can never fail: a line as it would be
    // rendered after renumbering a published field must not be present.
    let compiled = compile();
    assert!(
        compiled
            .lines
            .contains("field norsk.api.manager.StartJobRequest 3 node_id .norsk.api.common.NodeId")
    );
    assert!(
        !compiled
            .lines
            .contains("field norsk.api.manager.StartJobRequest 4 node_id .norsk.api.common.NodeId")
    );
}
