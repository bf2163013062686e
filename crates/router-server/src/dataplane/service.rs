//! The front door: classifies each request by path, checks the head size and the client's
//! key, and hands it to the proxy, the operator endpoints or the router's own endpoints.
//! Errors from all of them become responses here, in the error shape of the endpoint.

use super::ctx::Ctx;
use super::{endpoints, proxy};
use crate::admin::{self, handle_http, is_admin, AdminError, AdminHttp};
use crate::identity::{self, Loop};
use crate::metrics::Route;
use crate::response::{ApiError, ErrorShape, RespBody};
use crate::telemetry::Trace;
use http::{header, HeaderMap, Method, Request, Response};
use hyper::body::Incoming;
use opentelemetry::KeyValue;
use router_core::{ct_eq, Endpoint};
use std::sync::Arc;

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
    let trace = if route.is_inference() && !metrics_only {
        Trace::request(req.headers(), || {
            vec![
                KeyValue::new("http.request.method", method_name(req.method())),
                KeyValue::new("http.route", route_name(route, &path)),
            ]
        })
    } else {
        Trace::default()
    };
    let resp = match dispatch(&ctx, req, route, &path, metrics_only, &trace).await {
        Ok(r) => r,
        Err(e) => {
            trace.set(|| vec![KeyValue::new("error.type", e.code)]);
            trace.fail(&e.message);
            // A log line inside a traced request names its trace.
            let (trace_id, span_id) = (trace.trace_id(), trace.span_id());
            if e.status.is_server_error() {
                tracing::warn!(%path, status = e.status.as_u16(), error = %e.message, trace_id, span_id, "request failed");
            } else {
                tracing::debug!(%path, status = e.status.as_u16(), error = %e.message, trace_id, span_id, "request rejected");
            }
            e.into_response(shape)
        }
    };
    ctx.metrics.request(route, resp.status().as_u16());
    trace.set(|| {
        vec![KeyValue::new(
            "http.response.status_code",
            i64::from(resp.status().as_u16()),
        )]
    });
    resp
}

/// The method as a trace attribute (the common ones without a copy).
fn method_name(m: &Method) -> opentelemetry::Value {
    match *m {
        Method::POST => "POST".into(),
        Method::GET => "GET".into(),
        _ => m.as_str().to_owned().into(),
    }
}

/// The path as a trace attribute (the inference paths without a copy).
fn route_name(route: Route, path: &str) -> opentelemetry::Value {
    match route {
        Route::Chat => "/v1/chat/completions".into(),
        Route::Completions => "/v1/completions".into(),
        Route::Responses => "/v1/responses".into(),
        Route::Messages => "/v1/messages".into(),
        _ => path.to_owned().into(),
    }
}

async fn dispatch(
    ctx: &Arc<Ctx>,
    req: Request<Incoming>,
    route: Route,
    path: &str,
    metrics_only: bool,
    trace: &Trace,
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
            proxy::inference(ctx, req, ep, trace).await
        }
        Route::Models => {
            if req.method() != Method::GET {
                return Err(ApiError::method_not_allowed(req.method(), path, "GET"));
            }
            endpoints::models(ctx).await
        }
        Route::Passthrough => proxy::passthrough(ctx, req, trace).await,
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
