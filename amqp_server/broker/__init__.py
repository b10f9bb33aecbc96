"""The broker's model: the broker (broker), its virtual hosts with their exchanges, queues and
bindings (vhost, routing), policies, users and permissions (access_control), limits, resource
alarms, counters (stats), direct reply-to, the firehose and the definitions export. It knows no
socket and no channel; what it needs of a connection comes in through narrow interfaces."""
