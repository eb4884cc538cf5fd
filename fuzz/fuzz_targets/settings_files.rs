//! Arbitrary text read as the settings files people write: the operator's
//! (`--config`, read by `resolve` as at start) and `standalone`'s config,
//! decoded strictly and validated as `AutoSettings`. Either may be refused,
//! but nothing may panic, and a refusal always says what is wrong.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use norsk_auto_manager::automanager::validate_auto_settings;
use norsk_auto_manager::cli::documents::strict;
use norsk_auto_manager::cli::operator;
use norsk_auto_manager::cli::standalone::StandaloneConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args = operator::Args {
        config: Some("settings.yaml".into()),
        ..Default::default()
    };
    let read = |path: &Path| {
        assert_eq!(path, Path::new("settings.yaml"), "only the settings file is read");
        Ok(text.to_owned())
    };
    if let Err(errors) = operator::resolve(&args, read) {
        assert!(!errors.0.is_empty());
        assert!(errors.0.iter().all(|e| !e.is_empty()));
    }
    match strict::decode::<StandaloneConfig>(text) {
        Ok(config) => {
            if let Err(e) = validate_auto_settings(config.settings) {
                assert!(!e.errors.is_empty());
            }
        }
        Err(problems) => assert!(!problems.is_empty()),
    }
});
