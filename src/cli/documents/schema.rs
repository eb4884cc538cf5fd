//! The value constraints of a custom resource's OpenAPI schema — the one
//! `crds/` installs, generated from the Rust types — checked as the API
//! server checks them: `minimum` / `maximum` (and their exclusive forms),
//! `minLength` / `maxLength`, `pattern`, `enum`, `minItems` / `maxItems`
//! and `minProperties` / `maxProperties`. Types, required fields and
//! unknown fields are the typed decoding's part ([`super::strict`]); CEL
//! rules are [`super::rules`]'. A constraint added to a type's schema is
//! checked here with nothing else to change.

use serde_json::Value;

use super::strict::FieldPath;

/// Every constraint of `schema` that `value` breaks, with its path under
/// `path`.
pub fn violations(schema: &Value, value: &Value, path: &FieldPath) -> Vec<(FieldPath, String)> {
    let mut found = Vec::new();
    check(schema, value, path, &mut found);
    found
}

fn check(schema: &Value, value: &Value, path: &FieldPath, found: &mut Vec<(FieldPath, String)>) {
    if value.is_null() {
        // An absent optional field, or `nullable`: the typed decoding
        // refuses a null where none may be.
        return;
    }
    let mut fail = |message: String| found.push((path.clone(), message));
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let listed: Vec<String> = allowed.iter().map(Value::to_string).collect();
        fail(format!("must be one of {}", listed.join(", ")));
    }
    match value {
        Value::Number(number) => {
            if let Some(n) = number.as_f64() {
                bounds(schema, n, &mut fail);
            }
        }
        Value::String(text) => {
            size_bounds(
                schema,
                text.chars().count(),
                ("minLength", "maxLength"),
                |min| format!("must be at least {min} character(s) long"),
                |max| format!("must be at most {max} characters long"),
                &mut fail,
            );
            if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
                match regex::Regex::new(pattern) {
                    Ok(re) if !re.is_match(text) => fail(format!("{text:?} does not match {pattern}")),
                    Ok(_) => {}
                    // The schema is generated from this build's types; a
                    // pattern that does not compile is a defect of the build.
                    Err(e) => fail(format!("the schema's pattern {pattern} does not compile: {e}")),
                }
            }
        }
        Value::Array(items) => {
            size_bounds(
                schema,
                items.len(),
                ("minItems", "maxItems"),
                |min| format!("must have at least {min} item(s)"),
                |max| format!("must have at most {max} items"),
                &mut fail,
            );
            if let Some(item) = schema.get("items") {
                for (i, element) in items.iter().enumerate() {
                    check(item, element, &path.index(i), found);
                }
            }
        }
        Value::Object(fields) => {
            size_bounds(
                schema,
                fields.len(),
                ("minProperties", "maxProperties"),
                |min| format!("must have at least {min} entr(y/ies)"),
                |max| format!("must have at most {max} entries"),
                &mut fail,
            );
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|s| s.is_object());
            for (key, field) in fields {
                match (properties.and_then(|p| p.get(key)), additional) {
                    (Some(property), _) | (None, Some(property)) => check(property, field, &path.key(key), found),
                    // Not declared: the typed decoding reports it.
                    (None, None) => {}
                }
            }
        }
        Value::Bool(_) | Value::Null => {}
    }
}

/// A size (of characters, items or entries) against the schema's `keys`
/// (`minLength` / `maxLength`, ...): `at_least(min)` and `at_most(max)`
/// say what is broken.
fn size_bounds(
    schema: &Value,
    size: usize,
    keys: (&str, &str),
    at_least: impl Fn(u64) -> String,
    at_most: impl Fn(u64) -> String,
    fail: &mut impl FnMut(String),
) {
    let size = u64::try_from(size).unwrap_or(u64::MAX);
    if let Some(min) = schema.get(keys.0).and_then(Value::as_u64)
        && size < min
    {
        fail(at_least(min));
    }
    if let Some(max) = schema.get(keys.1).and_then(Value::as_u64)
        && size > max
    {
        fail(at_most(max));
    }
}

fn bounds(schema: &Value, n: f64, fail: &mut impl FnMut(String)) {
    let exclusive = |key: &str| schema.get(key).and_then(Value::as_bool).unwrap_or(false);
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
        if exclusive("exclusiveMinimum") && n <= min {
            fail(format!("must be greater than {min}"));
        } else if n < min {
            fail(format!("must be at least {min}"));
        }
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
        if exclusive("exclusiveMaximum") && n >= max {
            fail(format!("must be less than {max}"));
        } else if n > max {
            fail(format!("must be at most {max}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn found(schema: Value, value: Value) -> Vec<String> {
        violations(&schema, &value, &FieldPath::of(&["spec"]))
            .into_iter()
            .map(|(path, message)| format!("{path}: {message}"))
            .collect()
    }

    #[test]
    fn each_constraint_is_checked_at_its_path() {
        let schema = json!({"properties": {
            "timeoutSeconds": {"minimum": 1.0, "maximum": 86400.0},
            "jobs": {"maxItems": 1, "items": {"properties": {"jobName": {"minLength": 1, "pattern": "^[a-z]+$"}}}},
            "sameAz": {"enum": ["soft", "hard"]},
            "overrides": {"additionalProperties": {"maxProperties": 1}}
        }});
        let value = json!({
            "timeoutSeconds": 0,
            "jobs": [{"jobName": "Enc"}, {"jobName": ""}],
            "sameAz": "never",
            "overrides": {"enc": {"a": "1", "b": "2"}}
        });
        let mut got = found(schema, value);
        got.sort();
        assert_eq!(
            got,
            [
                "spec.jobs: must have at most 1 items",
                "spec.jobs[0].jobName: \"Enc\" does not match ^[a-z]+$",
                "spec.jobs[1].jobName: \"\" does not match ^[a-z]+$",
                "spec.jobs[1].jobName: must be at least 1 character(s) long",
                "spec.overrides.enc: must have at most 1 entries",
                "spec.sameAz: must be one of \"soft\", \"hard\"",
                "spec.timeoutSeconds: must be at least 1",
            ]
        );
    }

    #[test]
    fn a_value_inside_every_constraint_passes() {
        let schema = json!({"properties": {"n": {"minimum": 0.0, "exclusiveMinimum": true}, "s": {"maxLength": 3}}});
        assert!(found(schema.clone(), json!({"n": 0.5, "s": "abc", "other": 1})).is_empty());
        assert_eq!(found(schema, json!({"n": 0})), ["spec.n: must be greater than 0"]);
    }
}
