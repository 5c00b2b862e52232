//! The web dashboard: static assets compiled into the binary and served by
//! every node at `/` and `/assets/...`, on the API's own listener (so over
//! its TLS when it has one). The pages hold no data of their own: they call
//! the JSON API (and `GET /v1/stream`) with the token the user signed in
//! with, so a tenant token sees exactly what the API shows it. Nothing here
//! needs a token: the assets are the same for everyone and name no cluster.

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// One embedded file.
pub struct Asset {
    pub name: &'static str,
    pub content_type: &'static str,
    pub body: &'static [u8],
}

/// Everything the pages load. uPlot (charts) is vendored from the npm
/// package `uplot` 1.6.32, unmodified; its MIT licence is served next to it.
pub const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/app.js"),
    },
    Asset {
        name: "views.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/views.js"),
    },
    Asset {
        name: "states.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/states.js"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("assets/style.css"),
    },
    Asset {
        name: "vendor/uPlot.iife.min.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/vendor/uPlot.iife.min.js"),
    },
    Asset {
        name: "vendor/uPlot.min.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("assets/vendor/uPlot.min.css"),
    },
    Asset {
        name: "vendor/uPlot.LICENSE",
        content_type: "text/plain; charset=utf-8",
        body: include_bytes!("assets/vendor/uPlot.LICENSE"),
    },
];

const INDEX: &[u8] = include_bytes!("assets/index.html");

/// Scripts and styles from this origin only, and API calls to it only: a
/// page that holds an API token must not load or send anything elsewhere.
/// uPlot sizes its elements through `style` attributes, hence
/// 'unsafe-inline' for styles (never for scripts).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                   img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// The routes to merge into the API router (no token layer on them).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/assets/{*file}", get(asset))
}

pub fn find(name: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.name == name)
}

/// A strong validator for `body`: the same binary always serves the same
/// bytes, and an upgrade changes the tag, so caches revalidate cheaply and
/// never keep an old script next to a new page.
fn etag(body: &[u8]) -> String {
    let hash = blake3::hash(body).to_hex();
    format!("\"{}\"", &hash.as_str()[..16])
}

fn respond(headers: &HeaderMap, content_type: &'static str, body: &'static [u8]) -> Response {
    let tag = etag(body);
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag));
    let common = [
        // Revalidate every time (a 304 is tiny): the assets carry no
        // version in their names.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
    ];
    let tag = HeaderValue::from_str(&tag).unwrap_or_else(|_| HeaderValue::from_static("\"\""));
    if fresh {
        return (StatusCode::NOT_MODIFIED, common, [(header::ETAG, tag)]).into_response();
    }
    (
        common,
        [
            (header::ETAG, tag),
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        ],
        body,
    )
        .into_response()
}

async fn index(headers: HeaderMap) -> Response {
    respond(&headers, "text/html; charset=utf-8", INDEX)
}

async fn asset(headers: HeaderMap, Path(file): Path<String>) -> Response {
    match find(&file) {
        Some(a) => respond(&headers, a.content_type, a.body),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("no dashboard asset named '{file}'\n"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(path: &str, if_none_match: Option<&str>) -> Response {
        let mut req = Request::get(path);
        if let Some(tag) = if_none_match {
            req = req.header(header::IF_NONE_MATCH, tag);
        }
        let req = req.body(Body::empty()).expect("request");
        routes::<()>().oneshot(req).await.expect("infallible")
    }

    #[tokio::test]
    async fn index_and_assets_have_their_types_and_validators() {
        let page = get("/", None).await;
        assert_eq!(page.status(), StatusCode::OK);
        assert_eq!(
            page.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        assert_eq!(page.headers()[header::CACHE_CONTROL], "no-cache");
        assert!(page.headers().contains_key(header::CONTENT_SECURITY_POLICY));
        for a in ASSETS {
            let resp = get(&format!("/assets/{}", a.name), None).await;
            assert_eq!(resp.status(), StatusCode::OK, "{}", a.name);
            assert_eq!(resp.headers()[header::CONTENT_TYPE], a.content_type);
            let tag = resp.headers()[header::ETAG]
                .to_str()
                .expect("ascii")
                .to_string();
            let again = get(&format!("/assets/{}", a.name), Some(&tag)).await;
            assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{}", a.name);
        }
        assert_eq!(
            get("/assets/nope.js", None).await.status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            get("/assets/../Cargo.toml", None).await.status(),
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn the_page_loads_only_embedded_assets() {
        let html = std::str::from_utf8(INDEX).expect("utf-8");
        for src in html
            .split(['"', '\''])
            .filter(|s| s.starts_with("/assets/"))
        {
            assert!(
                find(&src["/assets/".len()..]).is_some(),
                "index.html loads {src}, which is not embedded"
            );
        }
        assert!(!html.contains("http://") && !html.contains("https://"));
    }

    /// The dashboard's state lists are the sdk's enum: a state added there
    /// and not here (the dashboard once knew 3 of the 6 final states) fails.
    #[test]
    fn the_dashboards_job_states_are_the_sdks() {
        use shoal_sdk::JobState;
        let list = |states: Vec<JobState>| {
            let names: Vec<String> = states.iter().map(|s| format!("\"{s}\"")).collect();
            format!("[{}]", names.join(", "))
        };
        let want = format!(
            "// Job states, as shoal_sdk::JobState names them; a unit test of the\n\
             // dashboard module keeps this file equal to the enum.\n\
             export const JOB_STATES = {};\n\
             // The final ones: how a job ended.\n\
             export const FINAL_STATES = {};\n",
            list(JobState::ALL.to_vec()),
            list(JobState::ALL.into_iter().filter(|s| s.is_final()).collect()),
        );
        assert_eq!(include_str!("assets/states.js"), want);
    }
}
