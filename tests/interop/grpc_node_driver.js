'use strict';
/*
 * Interop driver for rocketmq-client-nodejs@1.0.8, the official RocketMQ 5 gRPC client for
 * Node (on @grpc/grpc-js). The test runs it with NODE_PATH pointing at the throwaway install
 * under .interop/ and HOME at a scratch directory, and reads one JSON object per line from its
 * standard output; the client's own log goes to standard error (see `logger`).
 *
 * Every mode starts its client against `--endpoints HOST:PORT` (trimq's gRPC port, plaintext),
 * prints {"event": "started", "startup_ms"} once startup() returned (it returns only after
 * the broker answered the client's settings on the Telemetry stream), and prints
 * {"event": "stopped"} once shutdown() returned. The driver never calls process.exit() on
 * success: the process ends when Node has nothing left to do, so an error the client's gRPC
 * channel raises after shutdown (an 'error' event nobody listens to, which kills the process
 * with "Error: 14 UNAVAILABLE") shows as a non-zero exit.
 *
 *   produce --topic T --plan plan.json
 *     sends every message of the plan ({"messages": [{"body", "tag", "keys", "properties",
 *     "group", "topic", "refused"}]}, all but "body" optional; "group" is a FIFO message
 *     group, "topic" another topic than T, the producer's), one "sent" event per receipt
 *     ({"index", "message_id", "offset", "queue_id"}), or "refused" ({"index", "errors"})
 *     for a message the plan expects to be refused. A startup that fails (its route query
 *     refused, say) is "startup_failed" ({"ms", "errors"}); the producer is shut down and
 *     the process exits 4.
 *   simple --topic T --group G --count N [--change-key K] [--drain 1] --within MS
 *          [--filter-type TAG|SQL92 --expression E]
 *     a SimpleConsumer (await duration 5 s, invisible duration 15 s) receives until it has
 *     acked N distinct messages: a "received" event per delivery, "acked" per ack. The first
 *     delivery of the message keyed K gets changeInvisibleDuration(1 s) ("changed") instead
 *     of an ack, then an ack with the handle the change replaced ("stale_ack": refused or
 *     not, with the error code), and is acked when it comes back. Exits 3 ("timeout") if
 *     that is not done within MS milliseconds, 2 ("receive_error", with the error's class,
 *     code and message) if a receive fails. With --drain, one more receive (a long poll)
 *     afterwards: "drained" with what it got (acked too). It subscribes with the expression
 *     E (default "*") of the filter type (default TAG; SQL92 is the protocol's FilterType.SQL,
 *     a selector over the message's properties, TAGS standing for its tag).
 *   push --topic T --group G --fail-key K [--always-fail-key A]
 *     a PushConsumer whose listener prints "consumed" per delivery and answers FAILURE to the
 *     first delivery of the message keyed K and to every delivery of the message keyed A
 *     (SUCCESS otherwise); runs until standard input reaches end of file, then shuts down.
 *     Its "started" event names the consume service the broker's settings chose
 *     ("FifoConsumeService" on an orderly group, else "StandardConsumeService").
 *   cycles --kind producer|simple|push --topic T --group G --count N
 *     N start/shutdown cycles of one client kind ("cycle" per cycle, with its timings); a
 *     producer sends one message per cycle, a push consumer waits until its first receive
 *     is in flight ("Start to fetch" in its log).
 *
 * With --access-key AK --secret-key SK every client gets sessionCredentials (an ACL account);
 * without, it sends no authorization metadata. "errors" are an error and its causes, each
 * {"type", "code", "message"}.
 */

const crypto = require('crypto');
const fs = require('fs');
const util = require('util');
const {
  ConsumeResult, FilterExpression, Producer, PushConsumer, SimpleConsumer,
} = require('rocketmq-client-nodejs');
// The client takes a FilterType but does not export it: the generated protocol module's.
const { FilterType } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

function emit(event, fields) {
  const sorted = {};
  const all = Object.assign({ event }, fields || {});
  for (const key of Object.keys(all).sort()) sorted[key] = all[key];
  process.stdout.write(JSON.stringify(sorted) + '\n');
}

function parseArgs(argv) {
  const args = { mode: argv[0] };
  for (let i = 1; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    args[name] = argv[i + 1];
  }
  return args;
}

// The client's log, on standard error (its default logger writes under ~/logs). Log lines
// are watched for one thing: a push consumer's first receive ("Start to fetch message").
const fetchWaiters = [];
function logLine(level) {
  return (...args) => {
    const text = util.format(...args);
    process.stderr.write(`${new Date().toISOString()} ${level} ${text}\n`);
    if (text.startsWith('Start to fetch message from remote')) {
      while (fetchWaiters.length) fetchWaiters.shift()();
    }
  };
}
const logger = {
  info: logLine('INFO'),
  warn: logLine('WARN'),
  error: logLine('ERROR'),
  debug: () => {},
  close: () => {},
};

// A client bug, worked around: the push consumer's consume services open their own
// egg-logger file logger (getDefaultLogger(), under ~/logs) that shutdown() never closes;
// its 1 s flush interval keeps Node alive for ever. The FIFO one keeps it in a private field
// (see shutdownPush for the standard one), so every such logger is `logger` instead.
require('rocketmq-client-nodejs/dist/client/Logger').getDefaultLogger = () => logger;

// The client's options; with --access-key (and --secret-key) its sessionCredentials, which
// sign every call (metadata `authorization: MQv2-HMAC-SHA1 Credential=...`).
function base(args) {
  const options = { endpoints: args.endpoints, namespace: '', sslEnabled: false, logger };
  if (args.accessKey !== undefined) {
    options.sessionCredentials = { accessKey: args.accessKey, accessSecret: args.secretKey || '' };
  }
  return options;
}

// An error as the test checks it, with its chain of causes (the client wraps a startup
// failure twice around the status error that caused it).
function errorOf(err) {
  const chain = [];
  for (let e = err; e && chain.length < 5; e = e.cause) {
    chain.push({
      type: e.constructor ? e.constructor.name : null,
      code: e.code === undefined ? null : e.code,
      message: String(e.message),
    });
  }
  return chain;
}

function sha256(buffer) {
  return crypto.createHash('sha256').update(buffer).digest('hex');
}

function view(msg) {
  const props = {};
  for (const [ k, v ] of msg.properties.entries()) props[k] = v;
  return {
    message_id: msg.messageId,
    topic: msg.topic,
    tag: msg.tag === undefined ? null : msg.tag,
    keys: msg.keys,
    key: msg.keys.length ? msg.keys[0] : '',
    properties: props,
    message_group: msg.messageGroup || null,
    attempt: msg.deliveryAttempt,
    offset: msg.offset,
    corrupted: Boolean(msg.corrupted),
    body_len: msg.body.length,
    body_sha256: sha256(msg.body),
  };
}

async function timed(fn) {
  const t0 = Date.now();
  await fn();
  return Date.now() - t0;
}

// ---------------------------------------------------------------- modes
async function produce(args) {
  const plan = JSON.parse(fs.readFileSync(args.plan, 'utf8'));
  const producer = new Producer({ ...base(args), topics: [ args.topic ] });
  const t0 = Date.now();
  try {
    await producer.startup();
  } catch (err) {
    emit('startup_failed', { ms: Date.now() - t0, errors: errorOf(err) });
    process.exitCode = 4;
    emit('stopped', { shutdown_ms: await timed(() => producer.shutdown()) });
    return;
  }
  emit('started', { startup_ms: Date.now() - t0 });
  try {
    for (const [ index, item ] of plan.messages.entries()) {
      const options = {
        topic: item.topic || args.topic,
        body: Buffer.from(item.body, 'utf8'),
        keys: item.keys || [],
        properties: new Map(Object.entries(item.properties || {})),
      };
      if (item.tag) options.tag = item.tag;
      if (item.group) options.messageGroup = item.group;
      if (item.refused) {
        try {
          await producer.send(options);
        } catch (err) {
          emit('refused', { index, errors: errorOf(err) });
          continue;
        }
        throw new Error(`message ${index} was sent; it should have been refused`);
      }
      const receipt = await producer.send(options);
      emit('sent', {
        index, message_id: receipt.messageId, offset: receipt.offset,
        queue_id: receipt.messageQueue.queueId,
      });
    }
  } finally {
    emit('stopping');
    emit('stopped', { shutdown_ms: await timed(() => producer.shutdown()) });
  }
}

// The message keyed K: changeInvisibleDuration(1 s) on its first delivery; then an ack with
// the handle the change replaced, which must be refused; acked when it comes back.
async function changeThenStaleAck(consumer, msg, key) {
  const before = msg.receiptHandle;
  await consumer.changeInvisibleDuration(msg, 1000);
  emit('changed', { key, message_id: msg.messageId, new_handle: msg.receiptHandle !== before });
  const stale = Object.assign(Object.create(Object.getPrototypeOf(msg)), msg,
    { receiptHandle: before });
  try {
    await consumer.ack(stale);
    emit('stale_ack', { ok: true, code: 0 });
  } catch (err) {
    emit('stale_ack', { ok: false, code: err.code === undefined ? null : err.code,
      type: err.constructor.name });
  }
}

// The subscription's filter: a tag expression (the client's default type) or SQL92.
function filterOf(args) {
  const expression = args.expression || '*';
  const type = args.filterType || 'TAG';
  if (type === 'SQL92') return new FilterExpression(expression, FilterType.SQL);
  if (type !== 'TAG') throw new Error(`unknown filter type ${type}`);
  return expression;
}

function receiveError(err) {
  return {
    message: String(err && err.message),
    code: (err && err.code) || null,
    type: err && err.constructor ? err.constructor.name : null,
  };
}

async function simple(args) {
  const count = Number(args.count);
  const deadline = Date.now() + Number(args.within);
  const consumer = new SimpleConsumer({
    ...base(args), consumerGroup: args.group, awaitDuration: 5000,
    subscriptions: new Map([[ args.topic, filterOf(args) ]]),
  });
  emit('started', { startup_ms: await timed(() => consumer.startup()) });
  const acked = new Set();
  let changed = false;
  let changedBack = !args.changeKey;
  try {
    while (acked.size < count || !changedBack) {
      if (Date.now() > deadline) {
        emit('timeout', { acked: acked.size, changed, changed_back: changedBack });
        process.exitCode = 3;
        break;
      }
      let messages;
      try {
        messages = await consumer.receive(16, 15000);
      } catch (err) {
        // e.g. a body the client cannot decode: the whole receive fails.
        emit('receive_error', receiveError(err));
        process.exitCode = 2;
        break;
      }
      for (const msg of messages) {
        emit('received', view(msg));
        const isChangeKey = Boolean(args.changeKey) && msg.keys.includes(args.changeKey);
        if (isChangeKey && !changed) {
          changed = true;
          await changeThenStaleAck(consumer, msg, args.changeKey);
          continue;
        }
        if (isChangeKey) changedBack = true;
        await consumer.ack(msg);
        acked.add(msg.messageId);
        emit('acked', { message_id: msg.messageId });
      }
    }
    if (args.drain && !process.exitCode) {
      const t0 = Date.now();
      let messages = null;
      try {
        messages = await consumer.receive(16, 15000);
      } catch (err) {
        emit('receive_error', receiveError(err));
        process.exitCode = 2;
      }
      if (messages) {
        emit('drained', { ms: Date.now() - t0, messages: messages.map(view) });
        for (const msg of messages) await consumer.ack(msg);
      }
    }
  } finally {
    emit('stopping');
    emit('stopped', { shutdown_ms: await timed(() => consumer.shutdown()) });
  }
}

async function push(args) {
  let failed = false;
  const consumer = new PushConsumer({
    ...base(args), consumerGroup: args.group,
    subscriptions: new Map([[ args.topic, '*' ]]),
    messageListener: {
      consume(msg) {
        const always = Boolean(args.alwaysFailKey) && msg.keys.includes(args.alwaysFailKey);
        const fail = always || (!failed && msg.keys.includes(args.failKey));
        if (fail && !always) failed = true;
        emit('consumed', { ...view(msg), failed: fail, at_ms: Date.now() });
        return fail ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
      },
    },
  });
  const startupMs = await timed(() => consumer.startup());
  const service = consumer.getConsumeService();
  emit('started', { startup_ms: startupMs, consume_service: service && service.constructor.name });
  try {
    await new Promise(resolve => {
      process.stdin.on('end', resolve);
      process.stdin.resume();
    });
  } finally {
    emit('stopping');
    emit('stopped', { shutdown_ms: await timed(() => shutdownPush(consumer)) });
  }
}

// A client bug, worked around: the push consumer's StandardConsumeService ignores the
// `logger` option and opens its own egg-logger file logger (~/logs/rocketmq/...), which
// shutdown() never closes; its 1 s flush interval keeps Node alive for ever. Close it.
async function shutdownPush(consumer) {
  await consumer.shutdown();
  const service = consumer.getConsumeService();
  if (service && service.logger && typeof service.logger.close === 'function') {
    service.logger.close();
  }
}

// Resolves at the push consumer's first receive; rejects after `ms` milliseconds.
function firstFetch(ms) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no receive within ${ms} ms`)), ms);
    fetchWaiters.push(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}

async function cycles(args) {
  const count = Number(args.count);
  for (let i = 0; i < count; i++) {
    let client;
    let fetching;
    if (args.kind === 'producer') {
      client = new Producer({ ...base(args), topics: [ args.topic ] });
    } else if (args.kind === 'simple') {
      client = new SimpleConsumer({
        ...base(args), consumerGroup: args.group, awaitDuration: 5000,
        subscriptions: new Map([[ args.topic, '*' ]]),
      });
    } else {
      fetching = firstFetch(10000);
      fetching.catch(() => {}); // awaited below; a rejection before that is not unhandled
      client = new PushConsumer({
        ...base(args), consumerGroup: args.group,
        subscriptions: new Map([[ args.topic, '*' ]]),
        messageListener: { consume: () => ConsumeResult.SUCCESS },
      });
    }
    const startupMs = await timed(() => client.startup());
    let work = 0;
    if (args.kind === 'producer') {
      await client.send({ topic: args.topic, body: Buffer.from(`cycle ${i}`), tag: 'cycle' });
      work = 1;
    } else if (args.kind === 'push') {
      await fetching;
    }
    const shutdownMs = await timed(
      () => (args.kind === 'push' ? shutdownPush(client) : client.shutdown()));
    emit('cycle', { i, startup_ms: startupMs, shutdown_ms: shutdownMs, work });
  }
  emit('stopped');
}

const MODES = { produce, simple, push, cycles };

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const mode = MODES[args.mode];
  if (!mode) throw new Error(`unknown mode ${args.mode}`);
  await mode(args);
}

function reportHandles() {
  // What keeps the process alive after the client shut down (the test reads it when the
  // driver does not exit in time).
  const timer = setTimeout(() => {
    const handles = process._getActiveHandles().map(h => {
      const name = h && h.constructor ? h.constructor.name : typeof h;
      if (name === 'Socket') return `Socket(${h.remoteAddress}:${h.remotePort} fd=${h._handle && h._handle.fd})`;
      return name;
    });
    const resources = process.getActiveResourcesInfo().filter(r => r !== 'Timeout');
    process.stderr.write(`still alive 3 s after the last event; handles: ${handles.join(', ')}; `
      + `resources: ${resources.join(', ')}\n`);
  }, 3000);
  timer.unref();
}

main().then(reportHandles, err => {
  // A failure: the client may still hold timers and channels, so do not wait for them.
  emit('error', { message: String(err && err.stack ? err.stack : err) });
  process.exit(1);
});
