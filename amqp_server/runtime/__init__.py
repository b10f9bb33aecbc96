"""The asyncio shell and process: listeners and serve() (server), the command line (cli), worker
processes (workers), the socket hand-over between them (handover), definitions loaded at boot
(boot_definitions) and log escaping. The only layer that starts anything."""
