//! What the documents ask of nodes: `NorskNode` (cordon, spare spec,
//! declared inventory) and
//! `NodeDrain`.

use std::collections::BTreeSet;

use super::{Applier, DrainApplied, NodeApplied, Refusal, take_gone};
use crate::automanager::{AutoManagerHandle, CommandError, DrainPhase, DrainState, QueryError};
use crate::cli::standalone::follow::Files;
use crate::crd::{self, NodeDrainSpec};
use crate::decide::conditions::Observed;
use crate::decide::drain::{DrainCommand, drain_command, drain_refused};
use crate::decide::node::{
    BY_SPEC, CORDON_REFUSED, CORDONED, CordonStep, NOT_A_SPARE, apply_inventory, apply_spare_spec, cordon_done,
    cordon_refused, cordon_step,
};
use crate::model::NodeId;

/// Sends the command a `NodeDrain`'s `spec` becomes (see
/// [`drain_command`]) to `core`; the drain's state.
async fn start_drain(core: &AutoManagerHandle, spec: &NodeDrainSpec) -> Result<DrainState, CommandError> {
    match drain_command(spec) {
        DrainCommand::Interruption(node, notice) => core.handle_node_interruption(node, notice).await.map(|s| s.drain),
        DrainCommand::Drain(node, options) => core.drain_node(node, options).await,
    }
}

impl Applier {
    pub(super) async fn apply_nodes(&mut self, files: &Files) -> Result<(), QueryError> {
        let mut names = BTreeSet::new();
        for (wanted, node) in files.each::<crd::NorskNode>() {
            let name = wanted.resource.key().name;
            names.insert(name.clone());
            let node_id = NodeId(node.spec.node_id.clone());
            // A declaration needs no node yet: one told of later has it.
            apply_inventory(&self.core, node_id.clone(), node.spec.inventory.clone()).await?;
            let asked = node_id.clone();
            let (known, cordoned) = self
                .core
                .read(move |core| (core.knows_node(&asked), core.is_cordoned(&asked)))
                .await?;
            let record = self.nodes.entry(name.clone()).or_insert_with(|| NodeApplied {
                node_id: node_id.clone(),
                by_spec: false,
                cordon: None,
                spare: None,
            });
            let subject = wanted.resource.key().to_string();
            if !known {
                record.cordon = Some(Observed::no(
                    CORDONED,
                    "UnknownNode",
                    format!("no node {node_id} in the fleet (yet)"),
                ));
                let message = format!(
                    "{}: no node {node_id} in the fleet (yet); applied once it is",
                    wanted.origin()
                );
                self.report(&subject, Some(message), "applied");
                continue;
            }
            let by_spec = record.by_spec;
            let outcome = match cordon_step(node.spec.cordoned, cordoned, by_spec) {
                CordonStep::Stay(observed) => Ok(observed),
                CordonStep::Cordon => self.core.cordon_node(node_id.clone()).await.map(|()| cordon_done(true)),
                CordonStep::Uncordon => self
                    .core
                    .uncordon_node(node_id.clone())
                    .await
                    .map(|()| cordon_done(false)),
            };
            let cordon = match outcome {
                Ok(observed) => observed,
                Err(CommandError::Closed) => return Err(QueryError::Closed),
                Err(e) => cordon_refused(&e),
            };
            let spare = apply_spare_spec(&self.core, node_id.clone(), node.spec.spare.clone()).await?;
            let record = self.nodes.entry(name).or_insert_with(|| NodeApplied {
                node_id,
                by_spec: false,
                cordon: None,
                spare: None,
            });
            record.by_spec = cordon.status && cordon.reason == BY_SPEC;
            let refused: Vec<String> = [&cordon]
                .into_iter()
                .chain(spare.as_ref())
                .filter(|o| o.reason == CORDON_REFUSED || o.reason == NOT_A_SPARE)
                .map(|o| o.message.clone())
                .collect();
            record.cordon = Some(cordon);
            record.spare = spare;
            let message = (!refused.is_empty()).then(|| format!("{}: {}", wanted.origin(), refused.join("; ")));
            self.report(&subject, message, "applied");
        }
        // Documents gone: what they cordoned is uncordoned, what they
        // declared withdrawn.
        for (name, record) in take_gone(&mut self.nodes, &names) {
            self.report(&format!("NorskNode {name}"), None, "removed");
            apply_inventory(&self.core, record.node_id.clone(), None).await?;
            if record.by_spec {
                match self.core.uncordon_node(record.node_id.clone()).await {
                    Ok(()) | Err(CommandError::UnknownNode(_) | CommandError::NodeGone(_)) => {}
                    Err(CommandError::Closed) => return Err(QueryError::Closed),
                    Err(e) => eprintln!("error: NorskNode {name}: {} not uncordoned: {e}", record.node_id),
                }
            }
        }
        Ok(())
    }

    pub(super) async fn apply_drains(&mut self, files: &Files) -> Result<(), QueryError> {
        let mut names = BTreeSet::new();
        for (wanted, drain) in files.each::<crd::NodeDrain>() {
            let name = wanted.resource.key().name;
            names.insert(name.clone());
            let node_id = NodeId(drain.spec.node_id.clone());
            let record = self.drains.entry(name.clone()).or_insert_with(|| DrainApplied {
                node_id: node_id.clone(),
                started: None,
                refused: None,
                waiting: None,
                ended: false,
            });
            if let Some(started) = record.started {
                // Ours while the core holds a drain of the node started then;
                // a fresh core (Manager's stream broke) holds none: a drain
                // still in flight is started again (the core's drain is
                // idempotent per node), one that ended stays as it ended.
                let asked = node_id.clone();
                let held = self
                    .core
                    .read(move |core| core.drain(&asked).map(|s| (s.started, s.phase.is_final())))
                    .await?;
                match held {
                    Some((at, ended)) if at == started => {
                        record.ended = ended;
                        continue;
                    }
                    _ if record.ended => continue,
                    _ => {
                        record.started = None;
                        eprintln!(
                            "standalone: {}: the core lost the drain in flight; started again",
                            wanted.origin()
                        );
                    }
                }
            }
            if record.refused.as_ref().is_some_and(|r| r.spec == drain.spec) {
                continue;
            }
            let asked = node_id.clone();
            if !self.core.read(move |core| core.knows_node(&asked)).await? {
                let why = format!("no node {node_id} in the fleet (yet); the drain starts once it is");
                record.waiting = Some(why.clone());
                let message = format!("{}: {why}", wanted.origin());
                self.report(&wanted.resource.key().to_string(), Some(message), "started");
                continue;
            }
            let result = start_drain(&self.core, &drain.spec).await;
            let record = self.drains.entry(name).or_insert_with(|| DrainApplied {
                node_id: node_id.clone(),
                started: None,
                refused: None,
                waiting: None,
                ended: false,
            });
            record.waiting = None;
            let message = match result {
                Ok(state) => {
                    record.started = Some(state.started);
                    record.refused = None;
                    None
                }
                Err(CommandError::Closed) => return Err(QueryError::Closed),
                Err(e) if drain_refused(&e) => {
                    record.refused = Some(Refusal {
                        spec: drain.spec.clone(),
                        reason: "Refused",
                        message: e.to_string(),
                    });
                    Some(format!("{}: refused: {e}", wanted.origin()))
                }
                Err(e) => Some(format!("{}: not started yet: {e}", wanted.origin())),
            };
            self.report(&wanted.resource.key().to_string(), message, "started");
        }
        // Documents gone: a drain deleted before its terminate is cancelled.
        for (name, record) in take_gone(&mut self.drains, &names) {
            self.report(&format!("NodeDrain {name}"), None, "removed");
            let Some(started) = record.started else {
                continue;
            };
            let asked = record.node_id.clone();
            let before_terminate = self
                .core
                .read(move |core| {
                    core.drain(&asked).is_some_and(|s| {
                        s.started == started && !s.phase.is_final() && s.phase != DrainPhase::Terminating
                    })
                })
                .await?;
            if before_terminate {
                match self.core.uncordon_node(record.node_id.clone()).await {
                    Ok(()) | Err(CommandError::UnknownNode(_) | CommandError::NodeGone(_)) => {
                        eprintln!(
                            "standalone: NodeDrain {name}: removed before its terminate: the drain is cancelled, {} uncordoned",
                            record.node_id
                        );
                    }
                    Err(CommandError::Closed) => return Err(QueryError::Closed),
                    Err(e) => eprintln!("error: NodeDrain {name}: the drain could not be cancelled: {e}"),
                }
            }
        }
        Ok(())
    }
}
