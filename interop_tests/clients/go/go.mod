module interop_tests/clients/go

go 1.19

require github.com/rabbitmq/amqp091-go v1.5.0

// Debian's golang-github-rabbitmq-amqp091-go-dev: built offline from the packaged source.
replace github.com/rabbitmq/amqp091-go => /usr/share/gocode/src/github.com/rabbitmq/amqp091-go
