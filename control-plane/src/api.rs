//! The product REST API, `/api/v1`: a thin adapter over the same services the MCP tools use
//! (R2). It takes API tokens (`gh_api_…`) only; MCP tokens and console sessions get 401 with a
//! message naming the credential kind it wants (R20). Errors are mapped once, here.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post, put};
use axum::{Json, Router};
use serde_json::{Value, json};
use shared::OpCtx;
use shared::auth::{self, AuthFailure};
use shared::error::{Error, Resource};
use shared::input::parse_input;
use shared::secret::CredentialKind;
use shared::services::bookings::{self as booking_svc, FindBookingsInput, GetBookingInput};
use shared::services::bookings::{AddBookingNoteInput, CreateBookingInput, UpdateBookingInput};
use shared::services::bookings::{BookingWritten, NoteWritten};
use shared::services::customers::{self as customer_svc, FindCustomersInput, GetCustomerInput};
use shared::services::customers::{CreateCustomerInput, CustomerWritten, UpdateCustomerInput};
use shared::services::outcome::Written;
use shared::services::places;
use shared::views;

use crate::AppState;

pub fn routes(state: Arc<AppState>) -> Router<Arc<AppState>> {
    Router::new()
        .route("/customers", get(find_customers))
        .route("/customers/{customer}", get(get_customer))
        .route("/customers", post(create_customer))
        .route("/customers/{customer}", patch(update_customer))
        .route("/customers/{customer}/place", put(set_customer_place))
        .route("/technicians/{technician}/region", put(set_technician_region))
        .route("/bookings", get(find_bookings).post(create_booking))
        .route("/bookings/{booking}", get(get_booking).patch(update_booking))
        .route("/bookings/{booking}/notes", post(add_booking_note))
        .fallback(no_such_route)
        .layer(axum::middleware::map_response(json_errors))
        .layer(axum::middleware::from_fn_with_state(state, count))
}

async fn no_such_route() -> Response {
    let body = json!({"error": {"code": "not_found", "message": "No such route in the REST API.",
        "fix": "The routes are /api/v1/customers, /api/v1/customers/{customer}, /api/v1/customers/{customer}/place, /api/v1/technicians/{technician}/region, /api/v1/bookings, /api/v1/bookings/{booking} and /api/v1/bookings/{booking}/notes (docs/rest-api.md)."}});
    (StatusCode::NOT_FOUND, Json(body)).into_response()
}

/// Every API answer is JSON: the framework's own refusals (a body that is not JSON, a wrong
/// content type, a wrong method) arrive as plain text or empty, and are given the API's error
/// shape with what to change.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let detail = String::from_utf8_lossy(&text).trim().to_owned();
    let (code, fix) = match status {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            ("unsupported_media_type", "send the body as JSON with Content-Type: application/json")
        }
        StatusCode::METHOD_NOT_ALLOWED => {
            ("method_not_allowed", "use a method the route takes (the Allow header lists them)")
        }
        StatusCode::PAYLOAD_TOO_LARGE => ("too_large", "send a smaller body"),
        s if s.is_server_error() => ("internal", "retry in a moment"),
        _ => ("invalid_request", "send a JSON object as the body, as docs/rest-api.md shows"),
    };
    let message = if detail.is_empty() {
        status.canonical_reason().unwrap_or("refused").to_owned()
    } else {
        detail
    };
    let mut out = (status, Json(json!({"error": {"code": code, "message": message, "fix": fix}})))
        .into_response();
    for (name, value) in parts.headers.iter() {
        if name == header::ALLOW || name == header::WWW_AUTHENTICATE || name == header::RETRY_AFTER
        {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

async fn count(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let response = next.run(request).await;
    state.metrics.api_requests.with_label_values(&[&route, response.status().as_str()]).inc();
    response
}

/// An API error: HTTP status plus `{"error": {...}}`.
pub struct ApiError(Error);

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let error = &self.0;
        let status = match error {
            Error::NotFound { .. } => StatusCode::NOT_FOUND,
            Error::Invalid { .. } | Error::UnknownFields { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Error::Forbidden { .. }
            | Error::NoActor
            | Error::NotInToolset { .. }
            | Error::TurnedOff { .. }
            | Error::PolicyRefused { .. }
            | Error::PasskeyRequired { .. } => StatusCode::FORBIDDEN,
            Error::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Error::Conflict { .. }
            | Error::Duplicate { .. }
            | Error::CountMismatch { .. }
            | Error::ActionRefused { .. }
            | Error::ChangedSincePreview { .. }
            | Error::WrongState { .. } => StatusCode::CONFLICT,
            Error::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Error::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Error::Internal(detail) => {
                tracing::error!(error = %detail, "api request failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let mut body = json!({"code": error.code(), "message": error.to_string()});
        // Every refusal says what to change (R15), as the tools' errors do.
        body["fix"] = json!(match error {
            Error::Invalid { field, .. } => format!("correct `{field}` and send the request again"),
            Error::UnknownFields { .. } => {
                "remove the fields `unknown` lists; `allowed` lists what this route takes".to_owned()
            }
            Error::Forbidden { right } => format!(
                "this token's person lacks {}; a tenant admin can change their role",
                right.as_str()
            ),
            Error::Conflict { .. } => {
                "read `current`, then send the change again with `current_version` as `version`".to_owned()
            }
            Error::Duplicate { existing, resource, .. } => format!(
                "use {existing} (PATCH /api/v1/{}s/{existing} changes it); only if this really is another one, send the create again with \"separate\": true and a \"reason\"",
                resource.noun()
            ),
            Error::RateLimited { retry_after_secs, .. } => {
                format!("retry in {retry_after_secs} seconds")
            }
            Error::Unauthenticated(_) => {
                "send `Authorization: Bearer gh_api_…` with a live API token (console: API tokens)".to_owned()
            }
            Error::WrongState { .. } | Error::ActionRefused { .. } => {
                "read the record again and decide from its current state".to_owned()
            }
            Error::Internal(_) => "retry in a moment; if it persists, an operator can look up the request id in the logs".to_owned(),
            Error::Unavailable { .. } => format!(
                "nothing was changed; retry in {} seconds (Retry-After)",
                shared::error::UNAVAILABLE_RETRY_AFTER_SECS
            ),
            _ => "read the message, change the request and send it again".to_owned(),
        });
        match error {
            Error::Invalid { field, options, .. } => {
                body["field"] = json!(field);
                if !options.is_empty() {
                    body["options"] = json!(options);
                }
            }
            Error::UnknownFields { unknown, allowed } => {
                body["unknown"] = json!(unknown);
                body["allowed"] = json!(allowed);
            }
            Error::Forbidden { right } => body["right"] = json!(right.as_str()),
            Error::Conflict { current_version, current, .. } => {
                body["current_version"] = json!(current_version);
                body["current"] = (**current).clone();
            }
            Error::Duplicate { existing, .. } => body["existing"] = json!(existing),
            Error::NotFound { resource, .. } => {
                // Only routes the API has: the others are looked up in the console or by tools.
                body["fix"] = json!(match resource {
                    Resource::Customer => "find it with GET /api/v1/customers?query=…".to_owned(),
                    Resource::Booking => "find it with GET /api/v1/bookings".to_owned(),
                    other => format!(
                        "check the {} handle; the console lists them, and the REST API has no route for them",
                        other.noun()
                    ),
                });
            }
            _ => {}
        }
        let mut response = (status, Json(json!({ "error": body }))).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(shared::error::UNAVAILABLE_RETRY_AFTER_SECS),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"gatehouse-api\""),
            );
        }
        response
    }
}

/// The caller of an API request, authenticated by an API token.
pub struct ApiCtx(pub OpCtx);

impl FromRequestParts<Arc<AppState>> for ApiCtx {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let authorization = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let refuse =
            |f: AuthFailure| ApiError(Error::Unauthenticated(f.message(CredentialKind::Api)));
        auth::authenticate_api(&state.ds, authorization).await?.map(ApiCtx).map_err(refuse)
    }
}

/// Query strings become the same typed inputs the tools take, through the same parser.
fn query_input<T: serde::de::DeserializeOwned + schemars::JsonSchema>(
    q: BTreeMap<String, String>,
) -> Result<T, Error> {
    parse_input(Value::Object(q.into_iter().map(|(k, v)| (k, Value::String(v))).collect()))
}

async fn find_customers(
    State(state): State<Arc<AppState>>,
    ApiCtx(ctx): ApiCtx,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let input: FindCustomersInput = query_input(q)?;
    let found = customer_svc::find(&state.ds, &ctx, &input).await?;
    let now = jiff::Timestamp::now();
    let items: Vec<_> = found
        .items
        .iter()
        .map(|c| views::customer(c, &ctx.tenant().zone, &ctx.tenant().zone_name, now))
        .collect();
    Ok(Json(json!({"customers": items, "count": items.len(), "next_cursor": found.next_cursor})))
}

async fn get_customer(
    State(state): State<Arc<AppState>>,
    ApiCtx(ctx): ApiCtx,
    Path(customer): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let row = customer_svc::get(&state.ds, &ctx, &GetCustomerInput { customer }).await?;
    Ok(Json(json!(views::customer(
        &row,
        &ctx.tenant().zone,
        &ctx.tenant().zone_name,
        jiff::Timestamp::now()
    ))))
}

async fn find_bookings(
    State(state): State<Arc<AppState>>,
    ApiCtx(ctx): ApiCtx,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let input: FindBookingsInput = query_input(q)?;
    let found = booking_svc::find(&state.ds, &ctx, &input).await?;
    let now = jiff::Timestamp::now();
    let items: Vec<_> = found.items.iter().map(|b| views::booking(b, false, now)).collect();
    Ok(Json(json!({"bookings": items, "count": items.len(), "next_cursor": found.next_cursor})))
}

async fn get_booking(
    State(state): State<Arc<AppState>>,
    ApiCtx(ctx): ApiCtx,
    Path(booking): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let row =
        booking_svc::get(&state.ds, &ctx, &GetBookingInput { booking, notes_cursor: None }).await?;
    Ok(Json(json!(views::booking(&row, true, jiff::Timestamp::now()))))
}

// Writes: the same services, inputs and checks as the MCP tools (R2). A JSON body is parsed by
// the tools' parser; the handle in the path fills the input's handle field.

fn body_input<T: serde::de::DeserializeOwned + schemars::JsonSchema>(
    mut body: Value,
    path: Option<(&str, String)>,
) -> Result<T, Error> {
    if let (Some((field, handle)), Value::Object(map)) = (path, &mut body) {
        // The path names the record; a body naming another one is a mistake to report, not
        // to override silently.
        if let Some(given) = map.get(field)
            && given.as_str() != Some(handle.as_str())
        {
            return Err(Error::invalid(
                field,
                format!(
                    "the body names {given} but the path names {handle:?}; leave `{field}` out of the body"
                ),
            ));
        }
        map.insert(field.to_owned(), Value::String(handle));
    }
    parse_input(body)
}

async fn create_customer(
    State(state): State<Arc<AppState>>,
    ApiCtx(ctx): ApiCtx,
    Json(body): Json<Value>,
) -> Result<(StatusCode, Json<Written<CustomerWritten>>), ApiError> {
    let input: CreateCustomerInput = body_input(body, None)?;
    Ok((
        StatusCode::CREATED,
        Json(customer_svc::create_customer(&state.ds, &ctx, &input, jiff::Timestamp::now()).await?),
    ))
}

async fn update_customer(
    State(state): State<Arc<AppState>>,
    ApiCtx(ctx): ApiCtx,
    Path(customer): Path<String>,
    Json(body): Json<Value>,
) -> Result<Json<Written<CustomerWritten>>, ApiError> {
    let input: UpdateCustomerInput = body_input(body, Some(("customer", customer)))?;
    Ok(Json(customer_svc::update_customer(&state.ds, &ctx, &input, jiff::Timestamp::now()).await?))
}

/// Where a customer is: their region and IANA zone, which a tenant's policies read (no agent
/// sets them).
async fn set_customer_place(
    State(state): State<Arc<AppState>>,
    ApiCtx(ctx): ApiCtx,
    Path(customer): Path<String>,
    Json(body): Json<Value>,
) -> Result<Json<places::CustomerPlaced>, ApiError> {
    let input: places::CustomerPlaceInput = body_input(body, Some(("customer", customer)))?;
    Ok(Json(places::set_customer_place(&state.ds, &ctx, &input, jiff::Timestamp::now()).await?))
}

/// Where a technician works, which a tenant's policies read (`tenant:switch`).
async fn set_technician_region(
    State(state): State<Arc<AppState>>,
    ApiCtx(ctx): ApiCtx,
    Path(technician): Path<String>,
    Json(body): Json<Value>,
) -> Result<Json<places::TechnicianPlaced>, ApiError> {
    let input: places::TechnicianRegionInput = body_input(body, Some(("technician", technician)))?;
    Ok(Json(places::set_technician_region(&state.ds, &ctx, &input).await?))
}

async fn create_booking(
    State(state): State<Arc<AppState>>,
    ApiCtx(ctx): ApiCtx,
    Json(body): Json<Value>,
) -> Result<(StatusCode, Json<Written<BookingWritten>>), ApiError> {
    let input: CreateBookingInput = body_input(body, None)?;
    Ok((
        StatusCode::CREATED,
        Json(booking_svc::create_booking(&state.ds, &ctx, &input, jiff::Timestamp::now()).await?),
    ))
}

async fn update_booking(
    State(state): State<Arc<AppState>>,
    ApiCtx(ctx): ApiCtx,
    Path(booking): Path<String>,
    Json(body): Json<Value>,
) -> Result<Json<Written<BookingWritten>>, ApiError> {
    let input: UpdateBookingInput = body_input(body, Some(("booking", booking)))?;
    Ok(Json(booking_svc::update_booking(&state.ds, &ctx, &input, jiff::Timestamp::now()).await?))
}

async fn add_booking_note(
    State(state): State<Arc<AppState>>,
    ApiCtx(ctx): ApiCtx,
    Path(booking): Path<String>,
    Json(body): Json<Value>,
) -> Result<(StatusCode, Json<Written<NoteWritten>>), ApiError> {
    let input: AddBookingNoteInput = body_input(body, Some(("booking", booking)))?;
    Ok((
        StatusCode::CREATED,
        Json(booking_svc::add_booking_note(&state.ds, &ctx, &input, jiff::Timestamp::now()).await?),
    ))
}
