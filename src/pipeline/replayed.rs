//! `tollgate replay`'s way through the stages: a logged request decided
//! on the pipeline's clock, answered with its logged status instead of
//! being forwarded.

use http::{Request, StatusCode};

use super::ctx::{Ctx, Stop};
use super::{ConnInfo, Pipeline};
use crate::metrics::Outcome;

/// What the limits decided for one replayed request
/// ([`Pipeline::replay`]).
pub struct Replayed {
    /// The route matched, by its index in the config.
    pub route: Option<usize>,
    /// The answer: the logged status when it would have been forwarded.
    pub status: StatusCode,
    /// Every decision, by the limit's metrics index (`Metrics::limits`).
    pub decisions: Vec<(usize, Outcome)>,
    /// The keys refused (enforced or dry run), by limit.
    pub rejected: Vec<(usize, Outcome, String)>,
}

impl Pipeline {
    /// A logged request run through the stages on the pipeline's clock
    /// (`tollgate replay`): what would have been forwarded is answered
    /// with the status `logged` (a route limit that counts by status
    /// charges by it) and nothing is sent anywhere. Counted in the
    /// pipeline's metrics like a served request.
    pub async fn replay(
        &self,
        req: &mut Request<()>,
        conn: &ConnInfo,
        logged: StatusCode,
    ) -> Replayed {
        let resolved = self.client_ip.resolve(&conn.client, req.headers());
        let mut cx = Ctx::new(resolved, self.end(None, conn, false));
        let served = self
            .serve(req, &mut None, conn, &mut cx, Some(logged))
            .await;
        let status = match &served {
            Ok(resp) => resp.status(),
            Err(Stop::Limited(rejection)) => rejection.status,
            Err(Stop::Failed(err)) => err.status(),
        };
        self.count(&cx);
        cx.end.set_status(status);
        let decisions = cx
            .counted
            .iter()
            .filter_map(|&(origin, outcome)| Some((self.limit_index(origin, cx.route)?, outcome)))
            .collect();
        let rejected = cx
            .rejected_keys
            .iter()
            .filter_map(|(origin, outcome, key)| {
                Some((self.limit_index(*origin, cx.route)?, *outcome, key.clone()))
            })
            .collect();
        Replayed {
            route: cx.route.map(|r| r.index),
            status,
            decisions,
            rejected,
        }
    }
}
