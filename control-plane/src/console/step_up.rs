//! The proof a widening form carries: the passkey assertion made for its decision, turned into
//! a proof by the library. Every page whose form widens what agents may do reads its context
//! through [`proven`]; the service then decides whether the proof is needed and right.

use shared::OpCtx;
use shared::services::passkeys;

use super::Fail;
use super::extract::{Fields, Session};
use crate::AppState;

/// The context of a decision with the proof its form carried: a passkey assertion turned into
/// a proof by the library, or the context as it was (the service decides whether that is
/// enough under the tenant's policy). A bad assertion refuses the form and changes nothing.
pub(super) async fn proven(
    state: &AppState,
    session: &Session,
    ctx: OpCtx,
    form: &Fields,
) -> Result<OpCtx, Fail> {
    match assertion(form) {
        Some((ceremony, assertion)) => {
            let proof =
                passkeys::prove(&state.ds, &state.passkeys, &session.row, ceremony, assertion)
                    .await?;
            Ok(ctx.with_proof(proof))
        }
        None => Ok(ctx),
    }
}

/// The form's passkey ceremony and assertion, when it carries both.
pub(super) fn assertion(form: &Fields) -> Option<(&str, &str)> {
    Some((form.get("passkey_ceremony")?, form.get("passkey_assertion")?))
        .filter(|(c, a)| !c.is_empty() && !a.is_empty())
}
