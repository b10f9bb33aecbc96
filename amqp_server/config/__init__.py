"""What the operator configured: the settings model and its loading from flags, environment and
TOML (settings), TLS settings and contexts (tls), password hashing and SASL responses (auth), and
the coordination-service address format (cluster_address). Below the broker: everything reads it."""
