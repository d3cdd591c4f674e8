//! Access (`/access`): join tokens for operators, API tokens for admins,
//! each created through the REST API's own handlers. A new secret is shown
//! once, in the answer to the form that made it (never stored, never shown
//! again: the page is not cached and the store keeps only its hash).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use maud::{html, Markup};
use starling_api::{CreateApiToken, CreateJoinToken, Role};

use super::super::gate::FormFields;
use super::super::layout::{page, respond, utc, Caller, ConsoleError, Section};
use crate::http::Shared;

/// What the page shows once above its forms: a secret just made.
enum Created {
    Nothing,
    JoinToken {
        token: String,
        expires_ms: u64,
        uses: u32,
    },
    ApiToken {
        token: String,
        name: String,
        role: Role,
    },
}

async fn access_page(
    shared: &Arc<Shared>,
    caller: &Caller,
    created: Created,
) -> Result<Response, ConsoleError> {
    let tokens = if caller.may(Role::Admin) {
        match shared.access().api_tokens().await {
            Ok(tokens) => Some(
                tokens
                    .into_iter()
                    .map(starling_api::ApiTokenRecord::from)
                    .collect::<Vec<_>>(),
            ),
            Err(error) => return Err(ConsoleError::from_http(error.into()).await),
        }
    } else {
        None
    };
    let body = html! {
        h1 { "Access" }
        (created_box(&created))
        section {
            h2 { "Enroll a node" }
            p.muted { "A join token lets an agent enroll once (or as many times as its uses) before it expires: "
                code { "starling-agent run --join-token TOKEN --coordinator-url URL" } "." }
            form.filters method="post" action="/access/join-tokens" {
                (caller.csrf_field())
                label { "Valid for (seconds)" input type="number" name="ttl_seconds" min="1" value="3600"; }
                label { "Uses" input type="number" name="uses" min="1" value="1"; }
                button type="submit" { "Create join token" }
            }
        }
        @if let Some(tokens) = &tokens {
            section {
                h2 { "API tokens" }
                table #api-tokens {
                    thead { tr { th { "Name" } th { "Role" } th { "Id" } th { "Created" } th { "Revoked" } th {} } }
                    tbody {
                        @for token in tokens {
                            tr {
                                td { (token.name) } td { (token.role.as_str()) } td.mono { (token.id) }
                                td { (utc(token.created_ms)) }
                                td { (token.revoked_ms.map(utc).unwrap_or_default()) }
                                td {
                                    @if token.revoked_ms.is_none() {
                                        form method="post" action={ "/access/api-tokens/" (token.id) "/revoke" } {
                                            (caller.csrf_field())
                                            button.danger type="submit" { "Revoke" }
                                        }
                                    }
                                }
                            }
                        }
                        @if tokens.is_empty() { tr { td colspan="6" { span.muted { "Only the bootstrap token (--api-token) so far." } } } }
                    }
                }
                h2 { "New API token" }
                form.filters method="post" action="/access/api-tokens" {
                    (caller.csrf_field())
                    label { "Name (who it is for)" input type="text" name="name" required maxlength="128"; }
                    label { "Role"
                        select name="role" {
                            @for role in [Role::Viewer, Role::Developer, Role::Operator, Role::Admin] {
                                option value=(role.as_str()) { (role.as_str()) }
                            }
                        }
                    }
                    button type="submit" { "Create API token" }
                }
            }
        }
    };
    Ok(respond(
        StatusCode::OK,
        page("Access", caller, Section::Access, body),
    ))
}

fn created_box(created: &Created) -> Markup {
    match created {
        Created::Nothing => html! {},
        Created::JoinToken {
            token,
            expires_ms,
            uses,
        } => html! {
            div.secret #new-secret {
                p { strong { "New join token" } " — copy it now; it is not shown again. Valid until " (utc(*expires_ms)) " for " (uses) " enrollment(s)." }
                code { (token) }
            }
        },
        Created::ApiToken { token, name, role } => html! {
            div.secret #new-secret {
                p { strong { "New API token " (name) " (" (role.as_str()) ")" } " — copy it now; it is not shown again." }
                code { (token) }
            }
        },
    }
}

fn number<T: std::str::FromStr>(form: &FormFields, name: &str) -> Result<Option<T>, ConsoleError> {
    form.get(name)
        .map(str::trim)
        .filter(|value| !value.is_empty())
        .map(|value| {
            value.parse().map_err(|_| {
                ConsoleError::BadRequest(format!("{name} {value:?} is not a whole number"))
            })
        })
        .transpose()
}

/// `GET /access` (operator).
pub(crate) async fn access(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ConsoleError> {
    access_page(&shared, &caller, Created::Nothing).await
}

/// `POST /access/join-tokens` (operator).
pub(crate) async fn new_join_token(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Extension(form): Extension<FormFields>,
) -> Result<Response, ConsoleError> {
    let request = CreateJoinToken {
        ttl_seconds: number(&form, "ttl_seconds")?,
        uses: number(&form, "uses")?,
    };
    let created = match shared
        .access()
        .create_join_token(request.ttl_seconds, request.uses)
        .await
    {
        Ok(created) => created,
        Err(error) => return Err(ConsoleError::from_http(error.into()).await),
    };
    let created = Created::JoinToken {
        token: created.token,
        expires_ms: created.expires_ms,
        uses: created.uses,
    };
    access_page(&shared, &caller, created).await
}

/// `POST /access/api-tokens` (admin).
pub(crate) async fn new_api_token(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Extension(form): Extension<FormFields>,
) -> Result<Response, ConsoleError> {
    let role = form
        .get("role")
        .unwrap_or("")
        .parse::<Role>()
        .map_err(|error| ConsoleError::BadRequest(error.to_string()))?;
    let request = CreateApiToken {
        name: form.get("name").unwrap_or("").to_owned(),
        role,
    };
    let created = match shared
        .access()
        .create_api_token(&request.name, request.role)
        .await
    {
        Ok(created) => created,
        Err(error) => return Err(ConsoleError::from_http(error.into()).await),
    };
    let created = Created::ApiToken {
        token: created.token,
        name: created.name,
        role: created.role,
    };
    access_page(&shared, &caller, created).await
}

/// `POST /access/api-tokens/{id}/revoke` (admin). The token's console
/// sessions end at their next request (the gate checks the token).
pub(crate) async fn revoke_token(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Response, ConsoleError> {
    match shared.access().revoke_api_token(&id).await {
        Ok(()) => Ok(Redirect::to("/access").into_response()),
        Err(error) => Err(ConsoleError::from_http(error.into()).await),
    }
}
