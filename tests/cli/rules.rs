//! `docs/rules.md` maps every rule, default and constant of the spec to the
//! item that implements it and the tests that prove it. This test keeps the
//! map true: every file it names must exist, every item it names must be
//! defined in that file, and every test it names must be a test function of
//! that file. A renamed, moved or deleted function or test fails it, with
//! the line of `docs/rules.md` to fix.
//!
//! The map is Markdown tables whose rows are `| Rule | Where | Proved by |`.
//! In the `Where` and `Proved by` cells a backticked path ending in `.rs`
//! names a file, and each backticked identifier after it names an item of
//! that file (until the next path). A `Where` cell without a reference
//! starts with "none", a `Proved by` cell without one with "no test".

use std::collections::HashMap;
use std::fs;
use std::path::Path;

/// One reference of the map: a file, an item in it, and where the map says so.
struct Reference {
    line: usize,
    file: String,
    name: String,
    test: bool,
}

/// The cells of a table row, split on `|` outside backticks (`\|` is a
/// literal bar).
fn cells(row: &str) -> Vec<String> {
    let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
    let mut cells = vec![String::new()];
    let mut in_code = false;
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cells.last_mut().expect("a cell").push('|');
                chars.next();
            }
            '`' => {
                in_code = !in_code;
                cells.last_mut().expect("a cell").push(c);
            }
            '|' if !in_code => cells.push(String::new()),
            _ => cells.last_mut().expect("a cell").push(c),
        }
    }
    cells.into_iter().map(|c| c.trim().to_owned()).collect()
}

/// The backticked spans of a cell, in order.
fn spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The (file, name) pairs of a cell, or what in it is not a reference.
fn references(cell: &str) -> Result<Vec<(String, String)>, String> {
    let mut found = Vec::new();
    let mut file: Option<&str> = None;
    for span in spans(cell) {
        if span.ends_with(".rs") {
            file = Some(span);
        } else if let Some(file) = file {
            if !is_identifier(span) {
                return Err(format!("`{span}` after `{file}` is not an item name"));
            }
            found.push((file.to_owned(), span.to_owned()));
        } else {
            return Err(format!("`{span}` names no file before it"));
        }
    }
    if let Some(file) = file
        && !found.iter().any(|(f, _)| f == file)
    {
        return Err(format!("`{file}` is followed by no item name"));
    }
    Ok(found)
}

/// Whether `source` defines `name` in one of the accepted forms: a `fn`,
/// `const`, `static`, `struct`, `enum`, `type`, `trait` or `mod` of that
/// name, or a field `name:` (the settings' fields).
fn defines(source: &str, name: &str) -> bool {
    const KEYWORDS: [&str; 8] = ["fn", "const", "static", "struct", "enum", "type", "trait", "mod"];
    source.lines().any(|line| {
        let words: Vec<&str> = line
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        let item = words
            .windows(2)
            .any(|pair| KEYWORDS.contains(&pair[0]) && pair[1] == name);
        let trimmed = line.trim_start();
        let trimmed = trimmed
            .strip_prefix("pub(crate) ")
            .or_else(|| trimmed.strip_prefix("pub(super) "))
            .or_else(|| trimmed.strip_prefix("pub "))
            .unwrap_or(trimmed);
        let field = trimmed
            .strip_prefix(name)
            .is_some_and(|rest| rest.trim_start().starts_with(':') && !rest.trim_start().starts_with("::"));
        item || field
    })
}

/// Whether `source` has a test function `name`: `fn name` with `#[test]`,
/// `#[tokio::test]` (with or without arguments) among the attributes above
/// it (proptest's `#[test]` inside `proptest!` included).
fn defines_test(source: &str, name: &str) -> bool {
    let lines: Vec<&str> = source.lines().collect();
    lines.iter().enumerate().any(|(i, line)| {
        let declares = line
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .windows(2)
            .any(|pair| pair[0] == "fn" && pair[1] == name);
        declares
            && lines[..i]
                .iter()
                .rev()
                .map(|l| l.trim())
                .take_while(|l| l.starts_with("#[") || l.starts_with("//") || l.ends_with(")]") || l.is_empty())
                .any(|l| l.starts_with("#[test") || l.starts_with("#[tokio::test"))
    })
}

#[test]
fn every_function_and_test_docs_rules_md_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = fs::read_to_string(root.join("docs/rules.md")).expect("docs/rules.md");
    let mut broken = Vec::new();
    let mut references_found = Vec::new();
    let mut rows = 0;
    for (i, line) in doc.lines().enumerate() {
        let line_no = i + 1;
        if !line.trim_start().starts_with('|') {
            continue;
        }
        let cells = cells(line);
        let separator = cells.iter().all(|c| c.chars().all(|ch| ch == '-' || ch == ':'));
        if separator || cells.first().is_some_and(|c| c == "Rule") {
            continue;
        }
        if cells.len() != 3 {
            broken.push(format!(
                "docs/rules.md:{line_no}: {} cells, expected 3 (Rule, Where, Proved by)",
                cells.len()
            ));
            continue;
        }
        rows += 1;
        for (cell, test, empty_word) in [(&cells[1], false, "none"), (&cells[2], true, "no test")] {
            match references(cell) {
                Err(why) => broken.push(format!("docs/rules.md:{line_no}: {why}")),
                Ok(found) if found.is_empty() && !cell.to_lowercase().starts_with(empty_word) => broken.push(format!(
                    "docs/rules.md:{line_no}: a cell without a reference must start with \"{empty_word}\": {cell}"
                )),
                Ok(found) => references_found.extend(found.into_iter().map(|(file, name)| Reference {
                    line: line_no,
                    file,
                    name,
                    test,
                })),
            }
        }
    }
    let mut sources: HashMap<String, Option<String>> = HashMap::new();
    for reference in &references_found {
        let source = sources
            .entry(reference.file.clone())
            .or_insert_with(|| fs::read_to_string(root.join(&reference.file)).ok());
        let Reference { line, file, name, test } = reference;
        match source {
            None => broken.push(format!("docs/rules.md:{line}: no file {file} (for `{name}`)")),
            Some(source) if *test && !defines_test(source, name) => {
                broken.push(format!("docs/rules.md:{line}: {file} has no test fn `{name}`"))
            }
            Some(source) if !*test && !defines(source, name) => {
                broken.push(format!("docs/rules.md:{line}: {file} defines no `{name}`"))
            }
            Some(_) => {}
        }
    }
    assert!(
        rows >= 100,
        "docs/rules.md: only {rows} table rows parsed; is the table format intact?"
    );
    assert!(
        broken.is_empty(),
        "docs/rules.md has {} broken reference(s); fix the path or name, or the row:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn the_checker_tells_items_tests_and_fields_apart() {
    let source = "pub struct Settings {\n    pub pending_window: u32,\n}\n\n/// Doc.\n#[test]\nfn proves_it() {}\n\nfn helper() {}\n\n#[tokio::test(flavor = \"current_thread\")]\nasync fn proves_async() {}\npub const LIMIT: u64 = 1;\n";
    assert!(defines(source, "Settings"));
    assert!(defines(source, "pending_window"));
    assert!(defines(source, "LIMIT"));
    assert!(defines(source, "helper"));
    assert!(!defines(source, "missing"));
    assert!(defines_test(source, "proves_it"));
    assert!(defines_test(source, "proves_async"));
    assert!(!defines_test(source, "helper"));
    assert_eq!(
        references("`src/a.rs` `one`, `two`; `tests/b.rs` `three`"),
        Ok(vec![
            ("src/a.rs".to_owned(), "one".to_owned()),
            ("src/a.rs".to_owned(), "two".to_owned()),
            ("tests/b.rs".to_owned(), "three".to_owned()),
        ])
    );
    assert!(references("`a::b`").is_err());
    assert!(references("`src/a.rs` `a::b`").is_err());
    assert_eq!(cells("| `a \\| b` | `x|y` | c |").len(), 3);
}
