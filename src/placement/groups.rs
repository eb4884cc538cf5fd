//! Intra-replica structure of a bundle: which jobs form a co-located group
//! and which must be kept apart.
//!
//! `coLocateWith` is a hard rule and transitive (a group is the closure of
//! its links); `intraReplicaPlacement.sameNodeDefault: true` puts every job
//! that declares neither `coLocateWith` nor `separateFrom` into one group.
//! `separateFrom` is symmetric: either job naming the other keeps them apart.
//! Unknown names are ignored here; bundle validation reports them.

use std::collections::HashMap;

use crate::model::{BundleSpec, JobSpec};

/// The co-located groups of a bundle's jobs (the same for every replica).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct JobGroups {
    /// For each job (spec order), its group's representative: the lowest
    /// job index in the group.
    group_of: Vec<usize>,
}

impl JobGroups {
    pub(crate) fn of(spec: &BundleSpec) -> Self {
        // Most bundles link no jobs: each is a group of its own.
        let linked = spec.jobs.iter().any(|j| !j.co_locate_with.is_empty());
        if !linked && !spec.intra_replica_placement.same_node_default {
            return JobGroups {
                group_of: (0..spec.jobs.len()).collect(),
            };
        }
        let index: HashMap<&str, usize> = spec
            .jobs
            .iter()
            .enumerate()
            .rev()
            .map(|(i, j)| (j.job_name.as_str(), i))
            .collect();
        let mut parent: Vec<usize> = (0..spec.jobs.len()).collect();
        let mut default_group: Option<usize> = None;
        for (i, job) in spec.jobs.iter().enumerate() {
            for peer in &job.co_locate_with {
                if let Some(&j) = index.get(peer.as_str()) {
                    union(&mut parent, i, j);
                }
            }
            if spec.intra_replica_placement.same_node_default && is_rule_less(job) {
                match default_group {
                    Some(g) => union(&mut parent, g, i),
                    None => default_group = Some(i),
                }
            }
        }
        let group_of = (0..parent.len()).map(|i| find(&mut parent, i)).collect();
        JobGroups { group_of }
    }

    /// Jobs of `job`'s group (itself included), in spec order.
    pub(crate) fn members(&self, job: usize) -> impl Iterator<Item = usize> + '_ {
        let group = self.group_of[job];
        (0..self.group_of.len()).filter(move |&i| self.group_of[i] == group)
    }

    /// Whether two jobs share a group.
    pub(crate) fn together(&self, a: usize, b: usize) -> bool {
        self.group_of[a] == self.group_of[b]
    }

    /// Jobs in spec order, each co-located group placed together at its first
    /// member's position: the order `plan` places a replica in.
    pub(crate) fn placement_order(&self) -> Vec<usize> {
        let mut order = Vec::with_capacity(self.group_of.len());
        for (i, &group) in self.group_of.iter().enumerate() {
            if group == i {
                order.extend(self.members(i));
            }
        }
        order
    }
}

/// A job with neither intra-replica rule (what `sameNodeDefault` gathers).
fn is_rule_less(job: &JobSpec) -> bool {
    job.co_locate_with.is_empty() && job.separate_from.is_empty()
}

/// Whether either job names the other in `separateFrom`.
pub(crate) fn separated(a: &JobSpec, b: &JobSpec) -> bool {
    a.separate_from.contains(&b.job_name) || b.separate_from.contains(&a.job_name)
}

fn find(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

fn union(parent: &mut [usize], a: usize, b: usize) {
    let (ra, rb) = (find(parent, a), find(parent, b));
    // The lower index represents the group, so a group's representative is
    // its first job in spec order.
    let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
    parent[hi] = lo;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(yaml: &str) -> BundleSpec {
        yaml_serde::from_str(yaml).unwrap()
    }

    #[test]
    fn co_location_is_transitive_and_placed_at_the_first_member() {
        let spec = bundle(
            "pool: p\njobs:\n- {jobName: a}\n- {jobName: b, coLocateWith: [d]}\n- {jobName: c}\n- {jobName: d, coLocateWith: [e]}\n- {jobName: e}\n",
        );
        let groups = JobGroups::of(&spec);
        assert!(groups.together(1, 4));
        assert!(!groups.together(0, 1));
        assert_eq!(groups.placement_order(), vec![0, 1, 3, 4, 2]);
    }

    #[test]
    fn same_node_default_gathers_only_rule_less_jobs() {
        let spec = bundle(
            "pool: p\nintraReplicaPlacement: {sameNodeDefault: true}\njobs:\n- {jobName: a}\n- {jobName: b, separateFrom: [a]}\n- {jobName: c}\n",
        );
        let groups = JobGroups::of(&spec);
        assert!(groups.together(0, 2));
        assert!(!groups.together(0, 1));
        assert!(separated(&spec.jobs[0], &spec.jobs[1]));
        assert!(!separated(&spec.jobs[0], &spec.jobs[2]));
    }
}
