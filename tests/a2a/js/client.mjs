// The official A2A JavaScript SDK's client against an agent (a Synapse peer in the tests).
//
//   node client.mjs BASE_URL BINDING SCENARIO
//
// BINDING: JSONRPC, HTTP+JSON or GRPC (the transport it prefers; the card must offer it).
// Prints one JSON line per step: {"step": ..., ...} with the proto JSON of what it got;
// the last line is {"done": true}. Any error prints {"error": ...} and exits 1.
import {
  ClientFactory,
  ClientFactoryOptions,
  JsonRpcTransportFactory,
  RestTransportFactory,
  ServiceParameters,
  withA2AExtensions,
} from '@a2a-js/sdk/client';
import { GrpcTransportFactory } from '@a2a-js/sdk/client/grpc';
import {
  SendMessageRequest,
  StreamResponse,
  Task,
  TaskState,
  GetTaskRequest,
  CancelTaskRequest,
  ListTasksRequest,
  ListTasksResponse,
  TaskPushNotificationConfig,
  ListTaskPushNotificationConfigsRequest,
  ListTaskPushNotificationConfigsResponse,
  GetTaskPushNotificationConfigRequest,
} from '@a2a-js/sdk';

const [baseUrl, binding, scenario] = process.argv.slice(2);
const say = (value) => process.stdout.write(JSON.stringify(value) + '\n');

function message(parts, extra = {}) {
  return {
    messageId: `js-${process.hrtime.bigint()}`,
    role: 'ROLE_USER',
    parts,
    ...extra,
  };
}

function request(json) {
  return SendMessageRequest.fromJSON(json);
}

function taskOf(result) {
  // sendMessage answers a Task or a Message
  return Task.toJSON(result);
}

async function stream(client, json) {
  const events = [];
  for await (const event of client.sendMessageStream(request(json))) {
    events.push(StreamResponse.toJSON(event));
  }
  return events;
}

async function main() {
  const factory = new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [
        new JsonRpcTransportFactory(),
        new RestTransportFactory(),
        new GrpcTransportFactory(),
      ],
      preferredTransports: [binding],
    }),
  );
  const client = await factory.createFromUrl(baseUrl);
  say({ step: 'card', binding, name: client.agentCard?.name ?? null });

  if (scenario === 'echo') {
    const sent = await client.sendMessage(
      request({ message: message([{ text: 'hello from js' }]) }),
    );
    const task = taskOf(sent);
    say({ step: 'sent', task });
    const got = await client.getTask(GetTaskRequest.fromJSON({ id: task.id, historyLength: 1 }));
    say({ step: 'got', task: Task.toJSON(got) });
    const events = await stream(client, {
      message: message([{ data: { steps: 2, delay: 0.01 } }], { metadata: { taskType: 'slow' } }),
    });
    say({ step: 'streamed', events });
    const listed = await client.listTasks(ListTasksRequest.fromJSON({ pageSize: 10 }));
    say({ step: 'listed', listed: ListTasksResponse.toJSON(listed) });
  } else if (scenario === 'multi-turn') {
    // need_info: INPUT_REQUIRED, answered on the same task, streamed both times.
    const first = await stream(client, {
      message: message([{ data: { prompt: 'spring' } }], { metadata: { taskType: 'text_generation' } }),
    });
    say({ step: 'asked', events: first });
    const asked = first[first.length - 1];
    const taskId = asked.statusUpdate?.taskId ?? asked.task?.id;
    const contextId = asked.statusUpdate?.contextId ?? asked.task?.contextId;
    const second = await stream(client, {
      message: message([{ data: { style: 'modern' } }], { taskId, contextId }),
    });
    say({ step: 'answered', events: second });
  } else if (scenario === 'cancel') {
    const sent = await client.sendMessage(
      request({
        message: message([{ data: { steps: 1000, delay: 0.05 } }], { metadata: { taskType: 'slow' } }),
        configuration: { returnImmediately: true },
      }),
    );
    const task = taskOf(sent);
    const cancelled = await client.cancelTask(CancelTaskRequest.fromJSON({ id: task.id }));
    say({ step: 'cancelled', task: Task.toJSON(cancelled) });
    try {
      await client.cancelTask(CancelTaskRequest.fromJSON({ id: task.id }));
      say({ step: 'cancelled-again', error: null });
    } catch (error) {
      say({ step: 'cancelled-again', error: error.constructor.name, message: String(error.message) });
    }
    try {
      await client.getTask(GetTaskRequest.fromJSON({ id: 'no-such-task' }));
      say({ step: 'missing', error: null });
    } catch (error) {
      say({ step: 'missing', error: error.constructor.name, message: String(error.message) });
    }
  } else if (scenario.startsWith('push=')) {
    const hook = scenario.slice('push='.length);
    const sent = await client.sendMessage(
      request({
        message: message([{ data: { steps: 3, delay: 0.05 } }], { metadata: { taskType: 'slow' } }),
        configuration: { returnImmediately: true },
      }),
    );
    const task = taskOf(sent);
    const created = await client.createTaskPushNotificationConfig(
      TaskPushNotificationConfig.fromJSON({ taskId: task.id, url: hook, token: 'js-token' }),
    );
    say({ step: 'created', config: TaskPushNotificationConfig.toJSON(created) });
    const listed = await client.listTaskPushNotificationConfig(
      ListTaskPushNotificationConfigsRequest.fromJSON({ taskId: task.id }),
    );
    say({ step: 'listed', configs: ListTaskPushNotificationConfigsResponse.toJSON(listed) });
    const got = await client.getTaskPushNotificationConfig(
      GetTaskPushNotificationConfigRequest.fromJSON({ taskId: task.id, id: created.id }),
    );
    say({ step: 'got', config: TaskPushNotificationConfig.toJSON(got) });
  } else if (scenario.startsWith('extensions=')) {
    // Asks for the extensions named (comma-separated) on each call: a task sent, then one
    // sent without asking (which an agent with a required extension refuses).
    const asked = scenario.slice('extensions='.length).split(',');
    const options = { serviceParameters: ServiceParameters.create(withA2AExtensions(...asked)) };
    const sent = await client.sendMessage(
      request({ message: message([{ text: 'with extensions' }]) }),
      options,
    );
    say({ step: 'asked', task: taskOf(sent) });
    try {
      const plain = await client.sendMessage(request({ message: message([{ text: 'plain' }]) }));
      say({ step: 'plain', task: taskOf(plain) });
    } catch (error) {
      say({ step: 'plain', error: error.constructor.name, message: String(error.message) });
    }
  } else if (scenario === 'artifacts') {
    // Several named artifacts, chunked, streamed; then the task as GetTask lists it.
    const events = await stream(client, { message: message([{ text: 'report' }]) });
    say({ step: 'streamed', events });
    const last = events[events.length - 1];
    const taskId = last.statusUpdate?.taskId ?? last.task?.id;
    const got = await client.getTask(GetTaskRequest.fromJSON({ id: taskId }));
    say({ step: 'got', task: Task.toJSON(got) });
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
  say({ done: true });
}

main().then(
  () => process.exit(0),
  (error) => {
    say({ error: String(error?.stack ?? error) });
    process.exit(1);
  },
);
