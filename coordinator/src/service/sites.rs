//! The federation as this site sees it: its own name and every site gossip
//! told it of, with their state, digest and measured round trip.

use std::time::Instant;

use starling_api::SiteList;

use crate::federation::Federation;

/// `GET /api/v1/sites` and the console's sites page: not federated, or this
/// site and the others as the gossip table holds them now.
pub(crate) fn site_list(federation: Option<&Federation>) -> SiteList {
    let Some(federation) = federation else {
        return SiteList {
            federated: false,
            site: None,
            sites: Vec::new(),
        };
    };
    SiteList {
        federated: true,
        site: Some(federation.site.to_string()),
        sites: federation.gossip.table().entries(Instant::now()),
    }
}
