//! What workers answer besides jobs: node tags and image prefetch.

use norsk_auto_manager::manager::proto::common;
use norsk_auto_manager::manager::proto::manager::{self as pb, event_stream_event::Event};

use crate::sim_support::Sim;

fn node(id: &str) -> Option<common::NodeId> {
    Some(common::NodeId { node_id: id.into() })
}

#[tokio::test]
async fn updating_node_tags_answers_with_the_whole_tag_set() {
    let sim = Sim::start().await;
    sim.register("rack-1", 8.0).await;
    let mut events = sim.events().await;
    events.snapshot().await;
    let update = pb::UpdateNodeTagsRequest {
        node_id: node("rack-1"),
        set: [
            ("spare".to_owned(), "true".to_owned()),
            ("warmFor".to_owned(), "xyz".to_owned()),
        ]
        .into(),
        remove: vec!["pool".into()],
    };
    sim.manager.clone().update_node_tags(update).await.unwrap();
    let (tags, _) = events
        .until(|e| match e {
            Event::NodeTagsUpdated(t) => Some(t.tags.clone()),
            _ => None,
        })
        .await;
    let mut names: Vec<_> = tags.keys().cloned().collect();
    names.sort();
    assert_eq!(names, ["spare", "warmFor"]);
    let fleet = sim.snapshot().await.fleet;
    assert!(fleet.nodes[0].spare);
    assert_eq!(fleet.nodes[0].spare_spec.warm_for, ["xyz"]);
    sim.shutdown().await;
}

#[tokio::test]
async fn prefetched_images_are_reported_per_image_and_join_the_inventory() {
    let sim = Sim::start().await;
    sim.register("rack-1", 8.0).await;
    let mut events = sim.events().await;
    events.snapshot().await;
    let prefetch = pb::PrefetchImagesRequest {
        node_id: node("rack-1"),
        images: vec![
            "registry.example/encoder:1".into(),
            "registry.example/unavailable:2".into(),
        ],
    };
    sim.manager.clone().prefetch_images(prefetch).await.unwrap();
    let (results, _) = events
        .until(|e| match e {
            Event::ImagesPrefetched(p) => Some(p.results.clone()),
            _ => None,
        })
        .await;
    let outcome: Vec<_> = results.iter().map(|r| (r.image.as_str(), r.ok)).collect();
    assert_eq!(
        outcome,
        [
            ("registry.example/encoder:1", true),
            ("registry.example/unavailable:2", false)
        ]
    );
    assert!(!results[1].error.is_empty());
    let Event::NodeInventory(update) = events.next().await else {
        panic!("node_inventory follows")
    };
    assert_eq!(update.inventory.unwrap().images, ["registry.example/encoder:1"]);
    sim.shutdown().await;
}
