//! fencing-etcd's fault tests on a real 3-member cluster, one binary (one link)
//! for all of them, run one at a time (`faults::serial`): a leader killed or
//! stopped, a member cut off, a compacted watch (`cluster_faults`); a frozen
//! follower and a cut-off leader (`stalled_member`); a lease revoked or a
//! claim deleted by hand (`revoked_by_hand`).

mod faults;

mod cluster_faults;
mod revoked_by_hand;
mod stalled_member;
