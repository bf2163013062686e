//! The front door: classifies each request by path, checks the head size and the client's
//! key, and hands it to the proxy, the operator endpoints or the router's own endpoints.
//! Errors from all of them become responses here, in the error shape of the endpoint.

use super::ctx::Ctx;
use super::{endpoints, proxy};
use crate::admin::{self, handle_http, is_admin, AdminError, AdminHttp};
use crate::identity::{self, Loop};
use crate::metrics::Route;
use crate::response::{ApiError, ErrorShape, RespBody};
use crate::telemetry::SPAN_TARGET;
use http::{header, HeaderMap, Method, Request, Response};
use hyper::body::Incoming;
use router_core::{ct_eq, Endpoint};
use std::sync::Arc;
use tracing::field::Empty;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Entry point for every client request.
pub async fn handle(
    ctx: Arc<Ctx>,
    req: Request<Incoming>,
    metrics_only: bool,
) -> Response<RespBody> {
    let path = req.uri().path().to_owned();
    let route = match path.as_str() {
        "/v1/chat/completions" => Route::Chat,
        "/v1/completions" => Route::Completions,
        "/v1/responses" => Route::Responses,
        "/v1/messages" => Route::Messages,
        "/v1/models" => Route::Models,
        "/health" => Route::Health,
        "/metrics" => Route::Metrics,
        "/add_worker" | "/remove_worker" | "/list_workers" | "/admin/explain" => Route::Admin,
        p if p.starts_with("/v1/") => Route::Passthrough,
        _ => Route::Other,
    };
    let shape = if route == Route::Messages {
        ErrorShape::Anthropic
    } else {
        ErrorShape::OpenAi
    };
    let span = if route.is_inference() && !metrics_only {
        request_span(&req, &path)
    } else {
        tracing::Span::none()
    };
    let resp = match dispatch(&ctx, req, route, &path, metrics_only)
        .instrument(span.clone())
        .await
    {
        Ok(r) => r,
        Err(e) => {
            span.record("error.type", e.code);
            span.record("otel.status_code", "error");
            // In the request's span: a JSON log line names the trace.
            span.in_scope(|| {
                if e.status.is_server_error() {
                    tracing::warn!(%path, status = e.status.as_u16(), error = %e.message, "request failed");
                } else {
                    tracing::debug!(%path, status = e.status.as_u16(), error = %e.message, "request rejected");
                }
            });
            e.into_response(shape)
        }
    };
    ctx.metrics.request(route, resp.status().as_u16());
    span.record(
        "http.response.status_code",
        i64::from(resp.status().as_u16()),
    );
    resp
}

/// The trace span of one inference request, a child of the client's `traceparent` when it
/// sends one. Disabled (and free) when tracing is off.
fn request_span(req: &Request<Incoming>, path: &str) -> tracing::Span {
    let span = tracing::info_span!(target: SPAN_TARGET, "request",
        otel.kind = "server", http.request.method = %req.method(), http.route = path,
        http.response.status_code = Empty, gen_ai.request.model = Empty,
        request.bytes = Empty, response.bytes = Empty, ttft_ms = Empty,
        usage.prompt_tokens = Empty, usage.cached_tokens = Empty,
        usage.completion_tokens = Empty, stream.end = Empty, error.type = Empty,
        otel.status_code = Empty);
    if !span.is_disabled() {
        let _ = span.set_parent(crate::telemetry::extract(req.headers()));
    }
    span
}

async fn dispatch(
    ctx: &Arc<Ctx>,
    req: Request<Incoming>,
    route: Route,
    path: &str,
    metrics_only: bool,
) -> Result<Response<RespBody>, ApiError> {
    check_header_size(req.headers(), req.uri(), ctx.cfg.limits.max_header_bytes)?;
    match route {
        Route::Health => {
            let detailed = metrics_only || is_admin(ctx.cfg.admin_token.as_deref(), req.headers());
            return Ok(endpoints::health(ctx, detailed).await);
        }
        Route::Metrics => return Ok(endpoints::metrics(ctx)),
        _ if metrics_only => return Err(ApiError::not_found(path)),
        Route::Admin if path == "/admin/explain" => return explain(ctx, req).await,
        Route::Admin => {
            let admin = AdminHttp {
                state: &*ctx.state,
                client: &ctx.client,
                id: &ctx.id,
                token: ctx.cfg.admin_token.as_deref(),
                default_capacity: ctx.cfg.cache.default_capacity_tokens,
            };
            return handle_http(&admin, req, path).await;
        }
        _ => {}
    }
    // Before the key check: a request this router forwarded to itself carries no key.
    identity::check(&ctx.id, req.headers()).map_err(|l| {
        ApiError::loop_detected(match l {
            Loop::Back => "this request already passed through this router (or a peer of its cluster): an upstream is a router of this cluster, not an engine; remove it with routerctl leave",
            Loop::TooManyHops => "this request passed through too many routers: routers forward to each other in a circle",
        })
    })?;
    authorize(ctx, req.headers())?;
    match route {
        Route::Chat | Route::Completions | Route::Responses | Route::Messages => {
            if req.method() != Method::POST {
                return Err(ApiError::method_not_allowed(req.method(), path, "POST"));
            }
            let ep = Endpoint::from_path(path).ok_or_else(|| ApiError::not_found(path))?;
            proxy::inference(ctx, req, ep).await
        }
        Route::Models => {
            if req.method() != Method::GET {
                return Err(ApiError::method_not_allowed(req.method(), path, "GET"));
            }
            endpoints::models(ctx).await
        }
        Route::Passthrough => proxy::passthrough(ctx, req).await,
        _ => Err(ApiError::not_found(path)),
    }
}

/// `POST /admin/explain?endpoint=chat` with a request body: the decision, not forwarded.
async fn explain(ctx: &Arc<Ctx>, req: Request<Incoming>) -> Result<Response<RespBody>, ApiError> {
    admin::admin_headers(ctx.cfg.admin_token.as_deref(), req.headers())
        .map_err(|d| ApiError::from(AdminError::from(d)))?;
    if req.method() != Method::POST {
        return Err(ApiError::method_not_allowed(
            req.method(),
            "/admin/explain",
            "POST",
        ));
    }
    let name = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("endpoint=")))
        .unwrap_or("chat")
        .to_owned();
    let ep = admin::endpoint_named(&name).map_err(ApiError::from)?;
    let (parts, body) = proxy::read_body(ctx, req).await?;
    let session = parts
        .headers
        .get("x-session-id")
        .and_then(|v| v.to_str().ok());
    let v = admin::explain(&*ctx.state, &ctx.cfg, ep, &body, session).map_err(ApiError::from)?;
    Ok(crate::response::json_response(http::StatusCode::OK, &v))
}

fn check_header_size(h: &HeaderMap, uri: &http::Uri, limit: u64) -> Result<(), ApiError> {
    // The request target as sent (origin form, or absolute form with scheme and authority).
    let target = uri.path_and_query().map_or(1, |p| p.as_str().len())
        + uri.authority().map_or(0, |a| a.as_str().len() + 3)
        + uri.scheme_str().map_or(0, str::len);
    let size: usize = target
        + h.iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>();
    if size as u64 > limit {
        return Err(ApiError::headers_too_large(limit));
    }
    Ok(())
}

fn authorize(ctx: &Ctx, h: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &ctx.cfg.api_key else {
        return Ok(());
    };
    let presented = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .or_else(|| h.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim);
    match presented {
        Some(p) if ct_eq(p.as_bytes(), key.as_bytes()) => Ok(()),
        _ => Err(ApiError::unauthorized()),
    }
}
