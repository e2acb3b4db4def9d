//! Setup the in-process benches share (`api_load.rs`, `serve_memory.rs`): an admin token and
//! simulated pool hosts, written through the coordinator's own store and service layer.

use coordinator::model::{Grant, Role};
use coordinator::service::{NewHost, Service};
use coordinator::store::SharedStore;

/// Any host key: the benches' hosts are never reached over SSH.
const HOST_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGtlzZ3MFfuteL1oS3yr1Yx72/TNBkiGm1NN+JwrXN+M";

/// A global admin token named `bench`; its secret.
pub async fn admin_token(store: &SharedStore) -> String {
    let (_, token) = coordinator::tokens::create(
        &**store,
        "bench",
        &[Grant {
            namespace: "*".into(),
            role: Role::Admin,
        }],
    )
    .await
    .expect("cannot create the bench's admin token");
    token
}

/// Enrols each of `names` at 127.0.0.1:`port` with room for any number of Agents.
pub async fn enrol_hosts(service: &Service, names: &[String], port: u16) {
    for name in names {
        service
            .enrol_host(
                "bench",
                NewHost {
                    name: name.clone(),
                    address: "127.0.0.1".into(),
                    port,
                    host_key: HOST_KEY.into(),
                    max_agents: u32::MAX,
                    login_user: None,
                    jump: None,
                },
            )
            .await
            .expect("cannot enrol a bench host");
    }
}
