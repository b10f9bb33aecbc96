<?php
// What the two PHP scenario scripts (amqplib_scenarios.php, ext_scenarios.php) share: their JSON
// output, the events where they wait for the test, the large bodies' pattern, and running the
// scenario the command line names:
//
//     php <script> <scenario> <amqp-url> [ca-file]
//
// Each scenario is a function scenario_<name>($url) (scenario_tls($url, $ca_file)) that returns
// what it observed, or ['error' => ...]; the last line printed is {"ok": true, ...that...}, or
// {"ok": false, "error": "..."} (exit 1). The interactive ones (blocked, restart) first print
// {"event": ...} lines and wait for a line on stdin while the test changes the broker.

declare(strict_types=1);

const SCENARIOS = ['connect', 'confirms', 'prefetch', 'reject_requeue', 'channel_error', 'heartbeats', 'large_message',
                   'tls', 'blocked', 'restart'];

function emit(array $object): void
{
    echo json_encode($object, JSON_UNESCAPED_SLASHES), "\n";
    flush();
}

/** Tells the test where the scenario is, then waits for its line on stdin. */
function event(string $name): void
{
    emit(['event' => $name]);
    if (fgets(STDIN) === false) {
        throw new RuntimeException("the test closed stdin at event $name");
    }
}

/** A body of $size bytes: byte i is (i * 31 + 7) % 251, as in the other languages' scenarios. */
function pattern(int $size): string
{
    $cycle = '';  // the pattern repeats every 251 bytes
    for ($i = 0; $i < 251; $i++) {
        $cycle .= chr(($i * 31 + 7) % 251);
    }
    return substr(str_repeat($cycle, intdiv($size, 251) + 1), 0, $size);
}

/** Runs the scenario $argv names and prints its report; exits 1 when it failed. */
function run_scenario(array $argv): void
{
    [$script, $scenario, $url] = $argv + [null, null, null];
    $ca_file = $argv[3] ?? null;
    if (!in_array($scenario, SCENARIOS, true) || $url === null) {
        emit(['ok' => false, 'error' => 'usage: php ' . basename((string)$script) . ' <' . implode('|', SCENARIOS)
                                        . '> <amqp-url> [ca-file]']);
        exit(1);
    }
    try {
        $result = $scenario === 'tls' ? scenario_tls($url, $ca_file) : ("scenario_$scenario")($url);
    } catch (\Throwable $e) {
        emit(['ok' => false, 'error' => get_class($e) . ': ' . $e->getMessage() . ' at ' . $e->getFile() . ':' . $e->getLine()]);
        exit(1);
    }
    if (isset($result['error'])) {
        emit(['ok' => false] + $result);
        exit(1);
    }
    emit(['ok' => true] + $result);
}
