//! The request pipeline: the phases every proxied request goes through, in
//! order, on both front ends (the fast path `h1`, hyper's `proxy`), each in
//! its own module. The front end parses the head and takes one routing
//! snapshot; then:
//!
//! 1. **context** (`context`, `request`): the request id, the CORS answer,
//!    what the request carries besides its body (`request::Meta`);
//! 2. **authenticate and admit** (`auth`, `admission`): the client key, the
//!    caller's identity, a slot (or the queue), memory for the body and render;
//! 3. **read the body** (`body`, `shape`): within its limit and deadline,
//!    parsed as far as routing needs;
//! 4. **select and plan** (`forward`, with `crate::pools` and the `planner`
//!    crate): the pool, the response-cache lookup, the prompt rendered once per
//!    renderer, the worker or the prefill/decode pair;
//! 5. **dispatch** (`forward`'s one retry loop, sending with the front end's
//!    client; `crate::pd` for a pair);
//! 6. **relay** (the front end's: `h1::upstream` or `crate::relay`);
//! 7. **account** (`account`): the admission, the worker's load charge and the
//!    metrics held by one guard (`account::InFlight`), every request counted once.

pub(crate) mod account;
pub mod admission;
pub mod auth;
pub(crate) mod body;
pub mod context;
pub(crate) mod forward;
pub(crate) mod request;
pub(crate) mod shape;
