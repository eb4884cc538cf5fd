//! Smoke test of the real control plane (etcd + kube-apiserver, see `support/control_plane.rs`):
//! the pieces the operator relies on work end to end against a real API server: a CRD with
//! an OpenAPI schema and CEL rules, `kubectl apply`, kube-rs watches, server-side apply on
//! the status subresource, and RBAC for ServiceAccount tokens.
//!
//! The CRD here is a stand-in defined for this test only; the operator's own CRDs get their
//! tests elsewhere.

use std::{pin::pin, time::Duration};

use futures::TryStreamExt;
use k8s_openapi::{
    api::{
        authentication::v1::SelfSubjectReview,
        rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, CustomResource, ResourceExt,
    api::{ApiResource, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    runtime::{
        WatchStreamExt,
        wait::{await_condition, conditions},
        watcher,
    },
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::control_plane;

const GROUP: &str = "smoke.automanager.norsk.video";
const CRD_NAME: &str = "widgets.smoke.automanager.norsk.video";
const FIELD_MANAGER: &str = "norsk-smoke-test";
const CEL_MESSAGE: &str = "minReplicas must not exceed maxReplicas";
const WAIT: Duration = Duration::from_secs(30);

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "smoke.automanager.norsk.video",
    version = "v1alpha1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus",
    // The CRD below is written by hand to exercise schema features directly.
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
struct WidgetSpec {
    size: i64,
    mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_replicas: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_replicas: Option<i64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
struct WidgetStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    observed_size: Option<i64>,
}

fn widget_crd() -> serde_json::Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": CRD_NAME },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": "widgets",
                "singular": "widget",
                "kind": "Widget",
                "listKind": "WidgetList",
            },
            "versions": [{
                "name": "v1alpha1",
                "served": true,
                "storage": true,
                "subresources": { "status": {} },
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size", "mode"],
                            "properties": {
                                "size": { "type": "integer", "minimum": 1 },
                                "mode": { "type": "string", "enum": ["fast", "slow"] },
                                "minReplicas": { "type": "integer" },
                                "maxReplicas": { "type": "integer" },
                            },
                            "x-kubernetes-validations": [{
                                "rule": "!has(self.minReplicas) || !has(self.maxReplicas) \
                                         || self.minReplicas <= self.maxReplicas",
                                "message": CEL_MESSAGE,
                            }],
                        },
                        "status": {
                            "type": "object",
                            "properties": {
                                "phase": { "type": "string" },
                                "observedSize": { "type": "integer" },
                            },
                        },
                    },
                }},
            }],
        },
    })
}

/// Installs (or re-applies, for the other tests of this binary) the test CRD and waits until
/// the API server serves it.
async fn install_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        CRD_NAME,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(widget_crd()),
    )
    .await
    .expect("apply the test CRD");
    tokio::time::timeout(WAIT, await_condition(crds, CRD_NAME, conditions::is_crd_established()))
        .await
        .expect("CRD established in time")
        .expect("watch the CRD");
}

fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> Box<kube::core::Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn kubectl_apply_watch_and_status_server_side_apply() {
    let cp = control_plane::shared().await;
    let client = cp.client();

    // The binaries carry the release version, not the v0.0.0-master of an unstamped build.
    let version = client.apiserver_version().await.expect("GET /version");
    assert_eq!(version.major, "1", "{version:?}");
    assert!(
        version.git_version.starts_with("v1.") && !version.git_version.contains("master"),
        "{version:?}"
    );

    install_crd(&client).await;
    let ns = cp.namespace("smoke").await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);

    // Watch first, then create the object with kubectl, as a user would.
    let mut arrivals = pin!(
        watcher(widgets.clone(), watcher::Config::default())
            .applied_objects()
            .try_filter(|w| futures::future::ready(w.name_any() == "blue"))
    );
    let manifest = format!(
        "apiVersion: {GROUP}/v1alpha1\n\
         kind: Widget\n\
         metadata:\n  name: blue\n\
         spec:\n  size: 3\n  mode: fast\n"
    );
    let out = cp.kubectl_apply(&ns, &manifest).expect("kubectl apply");
    assert!(
        out.contains("widget.smoke.automanager.norsk.video/blue created"),
        "{out}"
    );

    let seen = tokio::time::timeout(WAIT, arrivals.try_next())
        .await
        .expect("watch event in time")
        .expect("watch stream")
        .expect("watch stream ended");
    assert_eq!(seen.spec.size, 3);
    assert_eq!(seen.spec.mode, "fast");
    assert_eq!(seen.status, None);

    // Status goes through the status subresource with server-side apply, the way the
    // controllers write it.
    let status = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": "Widget",
        "status": { "phase": "Ready", "observedSize": 3 },
    });
    widgets
        .patch_status(
            "blue",
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&status),
        )
        .await
        .expect("server-side apply of status");
    let read = widgets.get_status("blue").await.expect("read status back");
    assert_eq!(
        read.status,
        Some(WidgetStatus {
            phase: Some("Ready".into()),
            observed_size: Some(3),
        })
    );
    let managers: Vec<_> = read
        .managed_fields()
        .iter()
        .map(|m| (m.manager.clone(), m.operation.clone(), m.subresource.clone()))
        .collect();
    assert!(
        managers.contains(&(Some(FIELD_MANAGER.into()), Some("Apply".into()), Some("status".into()))),
        "{managers:?}"
    );
    // The status subresource does not let the spec change: it is still kubectl's.
    assert_eq!(read.spec.size, 3);
}

#[tokio::test]
async fn schema_and_cel_rules_reject_invalid_objects() {
    let cp = control_plane::shared().await;
    let client = cp.client();
    install_crd(&client).await;
    let ns = cp.namespace("invalid").await;
    // Untyped, so the request can carry what the Rust type would not allow.
    let resource = ApiResource::erase::<Widget>(&());
    let widgets: Api<DynamicObject> = Api::namespaced_with(client, &ns, &resource);
    let object = |name: &str, spec: serde_json::Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": format!("{GROUP}/v1alpha1"),
            "kind": "Widget",
            "metadata": { "name": name },
            "spec": spec,
        }))
        .expect("a DynamicObject")
    };

    let status = api_error(
        widgets
            .create(&PostParams::default(), &object("no-size", json!({ "mode": "turbo" })))
            .await,
    );
    assert_eq!(status.code, 422, "{status:?}");
    assert_eq!(status.reason, "Invalid", "{status:?}");
    assert!(
        status
            .message
            .contains(r#"spec.mode: Unsupported value: "turbo": supported values: "fast", "slow""#),
        "{}",
        status.message
    );
    assert!(
        status.message.contains("spec.size: Required value"),
        "{}",
        status.message
    );

    let status = api_error(
        widgets
            .create(
                &PostParams::default(),
                &object(
                    "inverted",
                    json!({ "size": 1, "mode": "slow", "minReplicas": 5, "maxReplicas": 2 }),
                ),
            )
            .await,
    );
    assert_eq!(status.code, 422, "{status:?}");
    assert!(status.message.contains(CEL_MESSAGE), "{}", status.message);

    // kubectl shows a person the same message.
    let err = cp
        .kubectl_apply(
            &ns,
            &format!(
                "apiVersion: {GROUP}/v1alpha1\nkind: Widget\nmetadata:\n  name: inverted\n\
                 spec:\n  size: 1\n  mode: slow\n  minReplicas: 5\n  maxReplicas: 2\n"
            ),
        )
        .expect_err("kubectl apply of an invalid object");
    assert!(err.contains(CEL_MESSAGE), "{err}");

    let left = widgets.list(&ListParams::default()).await.expect("list");
    assert!(left.items.is_empty(), "nothing invalid was stored");
}

#[tokio::test]
async fn service_account_without_rights_is_forbidden() {
    let cp = control_plane::shared().await;
    let admin = cp.client();
    install_crd(&admin).await;
    let ns = cp.namespace("rbac").await;
    let sa = cp.service_account_client(&ns, "nobody").await;
    let user = format!("system:serviceaccount:{ns}:nobody");

    // The token authenticates: the 403 below is RBAC speaking, not a bad credential.
    let review: Api<SelfSubjectReview> = Api::all(sa.clone());
    let me = review
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview");
    let username = me.status.and_then(|s| s.user_info).and_then(|u| u.username);
    assert_eq!(username.as_deref(), Some(user.as_str()));

    let widgets: Api<Widget> = Api::namespaced(sa.clone(), &ns);
    let status = api_error(widgets.list(&ListParams::default()).await);
    assert_eq!(status.code, 403, "{status:?}");
    assert_eq!(status.reason, "Forbidden", "{status:?}");
    assert!(
        status.message.contains(&format!(
            r#"User "{user}" cannot list resource "widgets" in API group "{GROUP}""#
        )),
        "{}",
        status.message
    );

    // Granting the right lifts the denial (the authoriser's cache catches up within moments).
    let roles: Api<Role> = Api::namespaced(admin.clone(), &ns);
    let role = Role {
        metadata: ObjectMeta {
            name: Some("widget-reader".into()),
            ..Default::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![GROUP.into()]),
            resources: Some(vec!["widgets".into()]),
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..Default::default()
        }]),
    };
    roles.create(&PostParams::default(), &role).await.expect("create Role");
    let bindings: Api<RoleBinding> = Api::namespaced(admin, &ns);
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("nobody-reads-widgets".into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "widget-reader".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "nobody".into(),
            namespace: Some(ns.clone()),
            ..Default::default()
        }]),
    };
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("create RoleBinding");
    tokio::time::timeout(WAIT, async {
        loop {
            match widgets.list(&ListParams::default()).await {
                Ok(_) => break,
                Err(kube::Error::Api(s)) if s.code == 403 => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("list after the grant: {e}"),
            }
        }
    })
    .await
    .expect("RoleBinding took effect in time");
}
