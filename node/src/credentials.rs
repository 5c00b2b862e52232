//! Where this node's TLS identity is in force: the RPC endpoint (it serves
//! and dials with it) and the API's HTTPS listener. A renewed certificate
//! goes to both at once, so neither keeps presenting one that expires.

use shoal_mesh::api_tls::ApiCertificate;
use shoal_mesh::{NodeCredentials, RpcEndpoint};
use std::sync::Arc;

#[derive(Clone)]
pub struct CredentialsInForce {
    rpc: RpcEndpoint,
    api: Arc<ApiCertificate>,
}

impl CredentialsInForce {
    pub fn new(rpc: RpcEndpoint, api: Arc<ApiCertificate>) -> Self {
        CredentialsInForce { rpc, api }
    }

    /// Serves and dials with `creds` from the next connection on.
    pub async fn install(&self, creds: &NodeCredentials) -> Result<(), String> {
        self.rpc
            .set_credentials(creds)
            .await
            .map_err(|e| format!("the RPC endpoint refused the credentials: {e}"))?;
        self.api
            .set(creds)
            .map_err(|e| format!("the API refused the credentials: {e}"))
    }

    pub fn api_certificate(&self) -> &Arc<ApiCertificate> {
        &self.api
    }
}
