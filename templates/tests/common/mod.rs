//! Shared helpers of the template tests: fixture loading and asset paths.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use radix_templates::{ChatRequest, ChatTemplate, TemplateSource};
use serde_json::Value as Json;

/// The template test fixtures folder.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub use radix_e2e::asset_path;

/// One template under test.
pub struct TemplateCase {
    pub id: String,
    pub path: PathBuf,
    pub template: ChatTemplate,
}

/// Every template listed in `fixtures/templates.json`, loaded.
pub fn templates() -> Vec<TemplateCase> {
    let list: Json = serde_json::from_str(&std::fs::read_to_string(fixtures_dir().join("templates.json")).unwrap())
        .expect("templates.json is JSON");
    list.as_array()
        .expect("a list")
        .iter()
        .map(|entry| {
            let id = entry["id"].as_str().unwrap().to_owned();
            let source = &entry["source"];
            let path = if let Some(asset) = source["asset"].as_str() {
                asset_path(asset)
            } else {
                fixtures_dir().join(source["file"].as_str().unwrap())
            };
            let template = ChatTemplate::new(TemplateSource::from_path(&path).unwrap_or_else(|e| panic!("{id}: {e}")))
                .unwrap_or_else(|e| panic!("{id}: {e}"));
            TemplateCase { id, path, template }
        })
        .collect()
}

/// Every conversation fixture as (name, request).
pub fn conversations() -> Vec<(String, ChatRequest)> {
    let dir = fixtures_dir().join("conversations");
    let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    names
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|path| {
            let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
            let body: Json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let request = ChatRequest::from_json(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, request)
        })
        .collect()
}
