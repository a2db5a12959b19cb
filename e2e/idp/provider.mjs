// A real OpenID provider (oidc-provider) standing in for a tenant's identity provider in the
// e2e suite: one client (Gatehouse), accounts from IDP_ACCOUNTS, the development login and
// consent forms, ID tokens with email claims, and back-channel logout.
//
//   node provider.mjs  with IDP_PORT, IDP_CLIENT_ID, IDP_CLIENT_SECRET, IDP_REDIRECT_URI,
//   IDP_BACKCHANNEL_URI and IDP_ACCOUNTS='{"login": {"sub": …, "email": …, "email_verified": …}}'
import Provider from 'oidc-provider';

const port = Number(process.env.IDP_PORT);
const issuer = `http://127.0.0.1:${port}`;
const accounts = JSON.parse(process.env.IDP_ACCOUNTS);

const provider = new Provider(issuer, {
  clients: [{
    client_id: process.env.IDP_CLIENT_ID,
    client_secret: process.env.IDP_CLIENT_SECRET,
    redirect_uris: [process.env.IDP_REDIRECT_URI],
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    backchannel_logout_uri: process.env.IDP_BACKCHANNEL_URI,
    backchannel_logout_session_required: true,
    post_logout_redirect_uris: [process.env.IDP_REDIRECT_URI],
  }],
  // The login typed in the development form is the account's id, its `sub`.
  async findAccount(ctx, id) {
    const login = Object.keys(accounts).find((l) => accounts[l].sub === id);
    if (!login) return undefined;
    const account = accounts[login];
    return {
      accountId: account.sub,
      async claims() {
        return { sub: account.sub, email: account.email, email_verified: account.email_verified, name: account.name ?? login };
      },
    };
  },
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name'] },
  // The email claims go into the ID token, as Okta, Entra ID and Google put them there.
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: true },
    backchannelLogout: { enabled: true },
    rpInitiatedLogout: { enabled: true },
  },
  cookies: { keys: ['e2e-only-cookie-key'] },
  // Gatehouse runs on loopback in the tests, and oidc-provider refuses loopback addresses for
  // its back-channel logout calls (as Gatehouse refuses them outside development): let them.
  fetch: (url, options) => {
    delete options.dispatcher;
    return fetch(url, options);
  },
});
provider.on('backchannel.error', (ctx, err) => console.error('backchannel.error', err.message));
provider.on('backchannel.success', () => console.log('backchannel.success'));
provider.listen(port, '127.0.0.1', () => console.log(`listening ${issuer}`));
