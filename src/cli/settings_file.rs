//! The operator's settings file, followed while the operator runs. The
//! chart renders it into a ConfigMap mounted as a volume, and the kubelet
//! updates the mounted file in place after an edit (within about a minute).
//! `settings.templateImages` — what warmth is scored against, the spec's
//! `setTemplateImages` — is applied live: a new image rolled out to the
//! templates should steer placement at once, not at the next restart.
//! Everything else in the file (Manager's address, timeouts, the Lease)
//! shapes the connection or the election and takes effect at a restart;
//! the operator says so once per change rather than restarting itself.
//!
//! A changed file is validated exactly as at start ([`resolve`]); an invalid
//! one is reported once, with every problem, and nothing of it is applied.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::watch;

use super::operator::{Args, OperatorConfig, resolve};

/// Template name -> image references.
pub type TemplateImages = BTreeMap<String, Vec<String>>;

/// How often the file is read again. The kubelet swaps a symlink to update
/// a mounted ConfigMap, which file-notification watchers commonly miss;
/// reading a small file every few seconds costs nothing and adds little to
/// the kubelet's own delay.
pub const READ_EVERY: Duration = Duration::from_secs(5);

/// Follows `args`' settings file until the task is dropped: each change
/// that validates sends its `templateImages` on `images` when they
/// differ from those in force. `started` is the config the process started
/// with.
pub async fn follow(args: Args, started: OperatorConfig, images: watch::Sender<TemplateImages>) {
    let Some(path) = args.config.clone() else {
        return;
    };
    let mut in_force = started;
    let mut last_read = std::fs::read_to_string(&path).ok();
    loop {
        tokio::time::sleep(READ_EVERY).await;
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) => {
                // Said once: the file is read again until it is back.
                if last_read.take().is_some() {
                    tracing::warn!(file = %path.display(), error = %e, "the settings file cannot be read; the settings in force stay");
                }
                continue;
            }
        };
        if last_read.as_ref() == Some(&text) {
            continue;
        }
        last_read = Some(text.clone());
        in_force = changed(&args, &path, &text, in_force, &images);
    }
}

/// Applies one changed file text; returns the config now in force.
fn changed(
    args: &Args,
    path: &PathBuf,
    text: &str,
    in_force: OperatorConfig,
    images: &watch::Sender<TemplateImages>,
) -> OperatorConfig {
    let reread = resolve(args, |p| {
        if p == path {
            Ok(text.to_owned())
        } else {
            std::fs::read_to_string(p)
        }
    });
    let new = match reread {
        Ok(new) => new,
        Err(e) => {
            tracing::error!(file = %path.display(), error = %e, "the settings file changed and is invalid: nothing of the change is applied; the settings in force stay");
            return in_force;
        }
    };
    let templates = new.session.settings.template_images.clone();
    if templates != in_force.session.settings.template_images {
        tracing::info!(
            templates = templates.len(),
            images = templates.values().map(Vec::len).sum::<usize>(),
            "settings.templateImages changed: applied live"
        );
        images.send_replace(templates.clone());
    }
    if !same_beyond_templates(&in_force, &new) {
        tracing::warn!(
            file = %path.display(),
            "the settings file changed beyond settings.templateImages: those changes take effect when the operator restarts"
        );
    }
    // Only the template images are in force; the rest waits for a restart
    // and is compared against what the process runs with.
    let mut in_force = in_force;
    in_force.session.settings.template_images = templates;
    in_force
}

/// Whether `a` and `b` agree on everything a restart would change.
fn same_beyond_templates(a: &OperatorConfig, b: &OperatorConfig) -> bool {
    let settings = |c: &OperatorConfig| crate::automanager::AutoSettings {
        template_images: TemplateImages::new(),
        ..c.session.settings.clone()
    };
    let tls_domain = |c: &OperatorConfig| c.session.manager.tls.as_ref().and_then(|t| t.domain.clone());
    settings(a) == settings(b)
        && a.lease == b.lease
        && a.metrics_addr == b.metrics_addr
        && a.session.manager.url == b.session.manager.url
        && tls_domain(a) == tls_domain(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STARTED: &str = "settings:\n  url: http://manager:6790\n  templateImages: {encoder: [\"reg/encoder:1\"]}\n";

    fn args(path: PathBuf) -> Args {
        Args {
            config: Some(path),
            identity: Some("op-0".into()),
            ..Args::default()
        }
    }

    /// Lets the follower read the file once more.
    async fn one_read() {
        tokio::time::sleep(READ_EVERY + Duration::from_millis(10)).await;
        tokio::task::yield_now().await;
    }

    #[tokio::test(start_paused = true)]
    async fn changed_template_images_are_sent_and_an_invalid_file_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("operator.yaml");
        std::fs::write(&path, STARTED).unwrap();
        let args = args(path.clone());
        let started = resolve(&args, |p| std::fs::read_to_string(p)).expect("valid");
        let (tx, mut rx) = watch::channel(started.session.settings.template_images.clone());
        let follower = tokio::spawn(follow(args, started, tx));

        one_read().await;
        assert!(!rx.has_changed().unwrap(), "an unchanged file sends nothing");

        std::fs::write(&path, STARTED.replace("reg/encoder:1", "reg/encoder:2")).unwrap();
        one_read().await;
        assert!(rx.has_changed().unwrap());
        assert_eq!(
            rx.borrow_and_update().clone(),
            TemplateImages::from([("encoder".to_owned(), vec!["reg/encoder:2".to_owned()])])
        );

        // A typo: refused whole, the images in force stay.
        std::fs::write(&path, "settings:\n  templateImage: {encoder: [\"reg/encoder:3\"]}\n").unwrap();
        one_read().await;
        assert!(!rx.has_changed().unwrap(), "nothing of an invalid file is applied");

        // A change beyond the templates waits for a restart.
        std::fs::write(
            &path,
            STARTED
                .replace("reg/encoder:1", "reg/encoder:2")
                .replace("manager:6790", "other:6790"),
        )
        .unwrap();
        one_read().await;
        assert!(!rx.has_changed().unwrap(), "the same templates are not sent again");
        follower.abort();
    }

    #[test]
    fn only_what_a_restart_would_change_counts_beyond_the_templates() {
        let read = |text: &'static str| move |_: &std::path::Path| -> std::io::Result<String> { Ok(text.to_owned()) };
        let args = args(PathBuf::from("operator.yaml"));
        let a = resolve(&args, read(STARTED)).unwrap();
        let b = resolve(&args, read("settings:\n  url: http://manager:6790\n")).unwrap();
        assert!(same_beyond_templates(&a, &b));
        let c = resolve(&args, read("settings:\n  url: http://other:6790\n")).unwrap();
        assert!(!same_beyond_templates(&a, &c));
        let d = resolve(
            &args,
            read("settings:\n  url: http://manager:6790\nlease: {durationSeconds: 30, graceSeconds: 10}\n"),
        )
        .unwrap();
        assert!(!same_beyond_templates(&a, &d));
    }
}
