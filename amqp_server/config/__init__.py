"""What the operator configured: the settings model and its loading from flags, environment and
TOML (settings), TLS settings and contexts (tls), password hashing and SASL responses (auth), the
coordination-service address format (cluster_address), and what a vhost's or user's limits
definition may hold (limit_definitions). Below the broker: everything reads it."""
