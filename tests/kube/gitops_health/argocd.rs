//! Runs the Argo CD health checks of `deploy/argocd/resource_customizations/` the way Argo CD
//! does: the resource as a Lua table in the global `obj`, the script's returned table read as
//! `{status, message}`; and reads each kind's `health_test.yaml` (Argo CD's own test layout).

use std::path::{Path, PathBuf};

use mlua::{Lua, LuaSerdeExt, SerializeOptions, Table};
use serde::Deserialize;
use serde_json::Value;

/// Where the checks live: `<group>/<Kind>/health.lua`.
pub fn customizations_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/argocd/resource_customizations/automanager.norsk.video")
}

/// What a health check answers.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Health {
    /// `Healthy`, `Progressing`, `Degraded`, `Suspended`, `Missing` or `Unknown`.
    pub status: String,
    /// What Argo CD shows next to it.
    #[serde(default)]
    pub message: String,
}

/// One case of a `health_test.yaml`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Case {
    /// The expected answer.
    pub health_status: Health,
    /// The resource, relative to the kind's directory.
    pub input_path: String,
}

#[derive(Debug, Deserialize)]
struct Cases {
    tests: Vec<Case>,
}

/// The cases of one kind.
pub fn cases(kind_dir: &Path) -> Vec<Case> {
    let text = std::fs::read_to_string(kind_dir.join("health_test.yaml"))
        .unwrap_or_else(|e| panic!("{}/health_test.yaml: {e}", kind_dir.display()));
    yaml_serde::from_str::<Cases>(&text)
        .unwrap_or_else(|e| panic!("{}/health_test.yaml: {e}", kind_dir.display()))
        .tests
}

/// A YAML resource file as JSON.
pub fn read_object(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs the kind's `health.lua` on `object`.
pub fn run(kind_dir: &Path, object: &Value) -> Health {
    let script = std::fs::read_to_string(kind_dir.join("health.lua"))
        .unwrap_or_else(|e| panic!("{}/health.lua: {e}", kind_dir.display()));
    let lua = Lua::new();
    // Argo CD hands absent fields to Lua as nil, never as a null sentinel.
    let options = SerializeOptions::new()
        .serialize_none_to_null(false)
        .serialize_unit_to_null(false);
    let value = lua.to_value_with(object, options).expect("resource as a Lua value");
    lua.globals().set("obj", value).expect("set obj");
    let answer: Table = lua
        .load(&script)
        .set_name(kind_dir.display().to_string())
        .eval()
        .unwrap_or_else(|e| panic!("{}/health.lua failed: {e}", kind_dir.display()));
    Health {
        status: answer.get("status").expect("health.status"),
        message: answer
            .get::<Option<String>>("message")
            .expect("health.message")
            .unwrap_or_default(),
    }
}
