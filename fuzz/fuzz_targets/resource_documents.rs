//! Arbitrary text read as the resource documents people write (`plan`'s
//! inputs, the files `standalone` follows), through the same decoding and
//! the steps after it: the pools and hot spares validated as settings (as
//! `plan` and `standalone` do), the bundles planned on the examples' fleet
//! and the plan rendered, and, for a file in two versions (split at the
//! first NUL), the update rules between them. Decoding may refuse, but
//! nothing may panic, and every refusal names its document.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use norsk_auto_manager::automanager::{AutoSettings, validate_auto_settings};
use norsk_auto_manager::cli::documents::{Document, Kind, Resource, decode_file, strict, update_problems};
use norsk_auto_manager::cli::plan::{Output, Sources, plan_rows, render_rows};
use norsk_auto_manager::model::{BundleId, BundleSpec, FleetSnapshot, HotSpareSpec, PlacementPool};

/// The examples' fleet snapshot and pools, for documents that bring none.
struct Examples {
    fleet: FleetSnapshot,
    pools: Vec<PlacementPool>,
}

fn examples() -> &'static Examples {
    static EXAMPLES: OnceLock<Examples> = OnceLock::new();
    EXAMPLES.get_or_init(|| {
        let fleet = strict::decode(include_str!("../../examples/fleets/studio.yaml")).expect("the fleet decodes");
        let pools = decode_file(include_str!("../../examples/pools.yaml"), &[Kind::PlacementPool])
            .expect("the pools decode")
            .into_iter()
            .filter_map(|d| match d.resource {
                Resource::PlacementPool(pool) => Some(pool.to_model()),
                _ => None,
            })
            .collect();
        Examples { fleet, pools }
    })
}

fn decode(text: &str) -> Option<Vec<Document>> {
    match decode_file(text, &Kind::ALL) {
        Ok(documents) => Some(documents),
        Err(errors) => {
            assert!(!errors.is_empty());
            for error in errors {
                assert!(error.document >= 1);
                assert!(!error.problems.is_empty());
            }
            None
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (old, new) = match text.split_once('\0') {
        Some((old, new)) => (Some(old), new),
        None => (None, text),
    };
    let Some(documents) = decode(new) else {
        return;
    };

    let mut pools = Vec::new();
    let mut hot_spares: Vec<HotSpareSpec> = Vec::new();
    let mut bundles: Vec<(BundleId, BundleSpec)> = Vec::new();
    for document in &documents {
        match &document.resource {
            Resource::PlacementPool(pool) => pools.push(pool.to_model()),
            Resource::HotSparePolicy(policy) => hot_spares.push(policy.spec.0.clone()),
            Resource::Bundle(bundle) => bundles.push((bundle.bundle_id(), bundle.spec.0.clone())),
            _ => {}
        }
    }
    if pools.is_empty() {
        pools = examples().pools.clone();
    }

    // `standalone` starts the core with the pools and policies in force.
    let _ = validate_auto_settings(AutoSettings {
        url: "manager.fuzz:6789".into(),
        placement_pools: pools.clone(),
        hot_spares: hot_spares.clone(),
        ..Default::default()
    });

    // `plan`: settings validated, the bundles placed on the fleet, rendered.
    let sources = Sources {
        settings: "documents.yaml".into(),
        fleet: "fleet.yaml".into(),
    };
    let fleet = &examples().fleet;
    if let Ok(rows) = plan_rows(pools, &hot_spares, fleet, &bundles, true, &sources) {
        for output in [Output::Table, Output::Wide, Output::Json, Output::Yaml] {
            let _ = render_rows(&rows, output, fleet);
        }
    }

    // `standalone` following a file: the update rules against the version
    // in force.
    if let Some(before) = old.and_then(decode) {
        for document in &documents {
            if let Some(previous) = before.iter().find(|b| b.resource.key() == document.resource.key()) {
                let _ = update_problems(new, document, &previous.resource);
            }
        }
    }
});
