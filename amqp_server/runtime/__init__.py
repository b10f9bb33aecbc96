"""The asyncio shell and process: listeners and serve() (server), the HTTP services it starts
(http_services), the command line (cli), worker processes (workers), the socket hand-over between
them (handover), definitions loaded at boot (boot_definitions) and the log's set-up and escaping
(log_escaping). The only layer that starts anything."""
