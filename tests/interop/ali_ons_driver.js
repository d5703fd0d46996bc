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
  }, credentials(args)));
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
  } else {
    throw new Error(`unknown mode ${args.mode}`);
  }
}

main().then(() => process.exit(0), err => {
  process.stderr.write(`driver failed: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
