'use strict';
/*
 * Interop driver for ali-ons@3.12.0 (the pure JavaScript RocketMQ Remoting client; it needs
 * urllib@2 as its `httpclient`). The test runs it with NODE_PATH pointing at the throwaway
 * install under .interop/ and reads one JSON object per line from its standard output.
 *
 *   node ali_ons_driver.js produce --namesrv HOST:PORT --group G --plan plan.json
 *     sends every message of the plan ({"topic", "messages": [{"key", "tag", "body"}]}),
 *     prints {"event": "sent", ...} per message, then {"event": "done"}.
 *   node ali_ons_driver.js consume --namesrv HOST:PORT --group G --topic T --expression TagA
 *                                  [--fail-key K]
 *     prints {"event": "received", ...} per delivery until standard input reaches end of file,
 *     then closes the consumer (which persists its offsets and unregisters) and prints
 *     {"event": "stopped"}. The first delivery (reconsumeTimes 0) of the message keyed K is
 *     answered with Consumer.ACTION_RETRY, so ali-ons sends it back (CONSUMER_SEND_MSG_BACK).
 *
 *   Either mode takes --access-key AK --secret-key SK: ali-ons then signs every request
 *   (RocketMQ ACL 1.0; its accessKeyId / accessKeySecret options). A failed send prints
 *   {"event": "send_failed", "key", "error"} and the producer goes on with the next message.
 *
 *   node ali_ons_driver.js stream --namesrv HOST:PORT --group G --topic T --prefix P
 *       --count N --pace-ms MS --retry-pause-ms MS --retry-for-ms MS [--poll-namesrv-ms MS]
 *     sends the messages keyed P-0 .. P-(N-1) one after the other, MS apart (a failover
 *     test's steady producer). A message is sent again (a new send of the same key) until
 *     SEND_OK: every failed attempt (a throw, or another status) prints {"event":
 *     "send_failed", "key", "attempt", "error"}, then it waits --retry-pause-ms; past
 *     --retry-for-ms it prints {"event": "gave_up", "key"} and goes on. A SEND_OK prints
 *     {"event": "sent", "key", "status", "msg_id", "offset", "queue_id", "attempts"}. It
 *     stops early once standard input reaches end of file, then prints {"event": "done",
 *     "sent", "gave_up"}.
 *   consume and stream take --poll-namesrv-ms: ali-ons's pollNameServerInteval (sic; 30 s
 *   by default), how often it asks the name server again for the routes it uses; a
 *   failover reaches the client no sooner.
 */

const crypto = require('crypto');
const fs = require('fs');
const httpclient = require('urllib');
const { Consumer, Message, Producer } = require('ali-ons');

function emit(event, fields) {
  const sorted = {};
  const all = Object.assign({ event }, fields || {});
  for (const key of Object.keys(all).sort()) sorted[key] = all[key];
  process.stdout.write(JSON.stringify(sorted) + '\n');
}

function parseArgs(argv) {
  const args = { mode: argv[0], expression: '*', failKey: '' };
  for (let i = 1; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    args[name] = argv[i + 1];
  }
  return args;
}

// ali-ons reports connection and pull problems as 'error' events; print them for the test log
// (an unhandled 'error' event would kill the process).
function onError(err) {
  process.stderr.write(`ali-ons error: ${err && err.stack ? err.stack : err}\n`);
}

// ACL 1.0 credentials, when the test gave them.
function credentials(args) {
  return args.accessKey ? { accessKeyId: args.accessKey, accessKeySecret: args.secretKey } : {};
}

// Client options only given on the command line (absent: ali-ons's defaults).
function tuning(args) {
  return args.pollNamesrvMs ? { pollNameServerInteval: Number(args.pollNamesrvMs) } : {};
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

async function stream(args) {
  const producer = new Producer(Object.assign(
    { httpclient, nameSrv: args.namesrv, producerGroup: args.group }, tuning(args)));
  producer.on('error', onError);
  await producer.ready();
  emit('started');
  let stopping = false;
  process.stdin.on('end', () => { stopping = true; });
  process.stdin.on('error', () => { stopping = true; });
  process.stdin.resume();
  const count = Number(args.count);
  const pace = Number(args.paceMs);
  const retryPause = Number(args.retryPauseMs);
  const retryFor = Number(args.retryForMs);
  let sent = 0;
  let gaveUp = 0;
  for (let i = 0; i < count && !stopping; i++) {
    const key = `${args.prefix}-${i}`;
    const first = Date.now();
    for (let attempt = 1; ; attempt++) {
      let error;
      try {
        const msg = new Message(args.topic, 'failover', Buffer.from(`${key}|failover`, 'utf8'));
        msg.keys = [ key ];
        const result = await producer.send(msg);
        if (result.sendStatus === 'SEND_OK') {
          emit('sent', { key, status: result.sendStatus, msg_id: result.msgId,
            offset: Number(result.queueOffset), queue_id: result.messageQueue.queueId,
            attempts: attempt });
          sent++;
          break;
        }
        error = `status ${result.sendStatus}`;
      } catch (err) {
        error = String(err && err.message ? err.message : err);
      }
      emit('send_failed', { key, attempt, error });
      if (Date.now() - first > retryFor) {
        emit('gave_up', { key });
        gaveUp++;
        break;
      }
      await sleep(retryPause);
    }
    await sleep(pace);
  }
  await producer.close();
  emit('done', { sent, gave_up: gaveUp });
}

async function produce(args) {
  const plan = JSON.parse(fs.readFileSync(args.plan, 'utf8'));
  const producer = new Producer(Object.assign(
    { httpclient, nameSrv: args.namesrv, producerGroup: args.group }, credentials(args)));
  producer.on('error', onError);
  await producer.ready();
  for (const item of plan.messages) {
    const msg = new Message(plan.topic, item.tag, Buffer.from(item.body, 'utf8'));
    msg.keys = [ item.key ];
    let result;
    try {
      result = await producer.send(msg);
    } catch (err) {
      emit('send_failed', { key: item.key, error: String(err && err.message ? err.message : err) });
      continue;
    }
    emit('sent', { key: item.key, tag: item.tag, status: result.sendStatus, msg_id: result.msgId,
      offset: Number(result.queueOffset) });
  }
  await producer.close();
  emit('done');
}

async function consume(args) {
  const consumer = new Consumer(Object.assign({
    httpclient,
    nameSrv: args.namesrv,
    consumerGroup: args.group,
  }, credentials(args), tuning(args)));
  consumer.on('error', onError);
  consumer.subscribe(args.topic, args.expression, async msg => {
    const body = msg.body || Buffer.alloc(0);
    const failed = msg.keys === args.failKey && msg.reconsumeTimes === 0;
    emit('received', {
      key: msg.keys || '',
      tag: msg.tags || '',
      topic: msg.topic,
      queue_id: msg.queueId,
      queue_offset: msg.queueOffset,
      reconsume_times: msg.reconsumeTimes,
      retry_topic: msg.retryTopic || '',
      body_len: body.length,
      body_sha256: crypto.createHash('sha256').update(body).digest('hex'),
      failed,
      msg_id: msg.msgId,
    });
    return failed ? Consumer.ACTION_RETRY : undefined;
  });
  await consumer.ready();
  emit('started');
  await new Promise(resolve => {
    process.stdin.on('end', resolve);
    process.stdin.on('error', resolve);
    process.stdin.resume();
  });
  emit('stopping');
  await consumer.close();
  emit('stopped');
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  if (args.mode === 'produce') {
    await produce(args);
  } else if (args.mode === 'consume') {
    await consume(args);
  } else if (args.mode === 'stream') {
    await stream(args);
  } else {
    throw new Error(`unknown mode ${args.mode}`);
  }
}

main().then(() => process.exit(0), err => {
  process.stderr.write(`driver failed: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
