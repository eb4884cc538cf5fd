//! Arbitrary bytes decoded as each message Manager sends (the stream event,
//! bundles, inventories, jobs) and converted to the model: decoding may
//! fail, conversion may refuse, but nothing may panic, and whatever converts
//! must satisfy the wire boundary's guarantees.
#![no_main]

use libfuzzer_sys::fuzz_target;
use norsk_auto_manager::manager::mirror::ManagerMirror;
use norsk_auto_manager::manager::proto::manager as pb;
use norsk_auto_manager::manager::wire;
use norsk_auto_manager::model::ManagerEvent;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let mut notes = wire::Notes::new();
    if let Ok(event) = pb::EventStreamEvent::decode(data)
        && let Ok(converted) = wire::event_from_pb(&event, &mut notes)
    {
        if let ManagerEvent::NodeInventory { inventory, .. } = &converted {
            assert!(inventory.utilization_cap > 0.0 && inventory.utilization_cap <= 1.0);
            assert!(inventory.total_capacity.is_finite() && inventory.total_capacity >= 0.0);
        }
        ManagerMirror::default().apply(&converted);
    }
    if let Ok(bundle) = pb::Bundle::decode(data)
        && let Ok(model) = wire::bundle_from_pb(&bundle, &mut notes)
    {
        // What converts must survive the round trip unchanged.
        let again = wire::bundle_from_pb(&wire::bundle_to_pb(&model), &mut notes);
        assert_eq!(again.as_ref(), Ok(&model));
    }
    if let Ok(inv) = pb::NodeInventory::decode(data) {
        let _ = wire::inventory_from_pb(&inv, &mut notes);
    }
    if let Ok(jwh) = pb::JobWithHistory::decode(data) {
        let _ = wire::runtime_job_from_pb(Some(&jwh), &mut notes);
    }
});
