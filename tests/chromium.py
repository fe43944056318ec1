"""Headless Chromium driven over the DevTools protocol, for the HTML report's tests: open a page from `file://` with the
network blocked, collect console messages, exceptions, dialogs and every request, move the mouse, take a screenshot."""
import base64, io, json, shutil, subprocess, tempfile, time, urllib.request
from pathlib import Path

def find_chromium() -> str|None:
    "The system's Chromium (Debian's `chromium`), or None"
    for name in ('chromium', 'chromium-browser', 'google-chrome', 'google-chrome-stable'):
        p = shutil.which(name)
        if p: return p
    return None

def why_no_browser() -> str|None:
    "Why no browser test can run here, in words; None when one can"
    try: import websocket  # noqa: F401
    except ImportError: return 'the websocket-client package is missing (it is in the dev extra)'
    if find_chromium() is None: return "no Chromium on this machine: `apt-get install chromium` (scripts/test.sh installs it when run as root)"
    return None

class Browser:
    "One headless Chromium with one page; `events` holds every DevTools event received, in order"
    def __init__(self, exe:str|None=None, width:int=1280, height:int=900, timeout:float=60.):
        import websocket
        self.dir, self.timeout, self.events, self._id = tempfile.mkdtemp(prefix='fxp-chromium-'), timeout, [], 0
        args = [exe or find_chromium(), '--headless=new', '--no-sandbox', '--disable-gpu', '--no-first-run', '--no-default-browser-check',
                '--disable-extensions', '--disable-background-networking', '--disable-component-update', '--disable-sync',
                '--proxy-server=127.0.0.1:9', '--host-resolver-rules=MAP * ~NOTFOUND', f'--window-size={width},{height}',
                f'--user-data-dir={self.dir}', '--remote-debugging-port=0', 'about:blank']
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file, t0 = Path(self.dir)/'DevToolsActivePort', time.monotonic()
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout: raise RuntimeError(f'Chromium did not start (exit {self.proc.poll()})')
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to 127.0.0.1, whatever the environment's proxy
        while True:
            pages = [t for t in json.load(opener.open(f'http://127.0.0.1:{port}/json/list', timeout=10)) if t.get('type') == 'page']
            if pages: break
            time.sleep(0.05)
        self.ws = websocket.create_connection(pages[0]['webSocketDebuggerUrl'], timeout=timeout, suppress_origin=True)
        for domain in ('Page', 'Runtime', 'Log', 'Network'): self.send(f'{domain}.enable')

    def send(self, method:str, **params):
        "Call a DevTools method and return its result, keeping the events that arrive meanwhile"
        self._id += 1
        self.ws.send(json.dumps(dict(id=self._id, method=method, params=params)))
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.timeout:
            msg = json.loads(self.ws.recv())
            if msg.get('id') == self._id:
                if 'error' in msg: raise RuntimeError(f'{method}: {msg["error"]}')
                return msg.get('result', {})
            self._event(msg)
        raise TimeoutError(f'{method}: no answer in {self.timeout} s')

    def _event(self, msg):
        self.events.append(msg)
        if msg.get('method') == 'Page.javascriptDialogOpening':  # note it, and close it, or the page blocks
            self.ws.send(json.dumps(dict(id=10**9 + len(self.events), method='Page.handleJavaScriptDialog', params=dict(accept=False))))

    def wait_for(self, method:str, timeout:float|None=None) -> dict:
        "The first event `method` (already received, or the next ones)"
        for e in self.events:
            if e.get('method') == method: return e
        t0 = time.monotonic()
        while time.monotonic() - t0 < (timeout or self.timeout):
            msg = json.loads(self.ws.recv())
            if 'method' in msg:
                self._event(msg)
                if msg['method'] == method: return msg
        raise TimeoutError(f'no {method} in {timeout or self.timeout} s')

    def open(self, path) -> float:
        "Load `path` from `file://` and wait for its load event: the seconds it took"
        t0 = time.monotonic()
        self.send('Page.navigate', url=Path(path).absolute().as_uri())
        self.wait_for('Page.loadEventFired')
        return time.monotonic() - t0

    def js(self, expression:str):
        "The value of `expression` in the page (awaited when it is a promise)"
        r = self.send('Runtime.evaluate', expression=expression, returnByValue=True, awaitPromise=True)
        if 'exceptionDetails' in r: raise RuntimeError(f"the page's JavaScript failed: {r['exceptionDetails']}")
        return r['result'].get('value')

    def move_mouse(self, x:float, y:float):
        self.send('Input.dispatchMouseEvent', type='mouseMoved', x=x, y=y)

    def screenshot(self) -> bytes: return base64.b64decode(self.send('Page.captureScreenshot', format='png')['data'])

    def problems(self) -> list:
        "Console messages, uncaught exceptions, log entries of level error or warning, and dialogs, in words"
        out = []
        for e in self.events:
            m, p = e.get('method'), e.get('params', {})
            if m == 'Runtime.consoleAPICalled': out.append(f"console.{p.get('type')}: {[a.get('value', a.get('description')) for a in p.get('args', [])]}")
            elif m == 'Runtime.exceptionThrown': out.append(f"exception: {p.get('exceptionDetails', {}).get('exception', {}).get('description')}")
            elif m == 'Log.entryAdded' and p.get('entry', {}).get('level') in ('error', 'warning'): out.append(f"log: {p['entry'].get('text')}")
            elif m == 'Page.javascriptDialogOpening': out.append(f"dialog: {p.get('type')} {p.get('message')!r}")
        return out

    def requests(self) -> list: return [e['params']['request']['url'] for e in self.events if e.get('method') == 'Network.requestWillBeSent']

    def close(self):
        try: self.ws.close()
        except Exception: pass
        self.proc.kill(); self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
    def __enter__(self): return self
    def __exit__(self, *a): self.close()

def distinct_colours(png:bytes) -> tuple:
    "How many distinct colours a PNG holds (a blank page: one or two), and how many of its pixels are coloured, not grey"
    import numpy as np, matplotlib.image as mpimg
    a = (mpimg.imread(io.BytesIO(png), format='png')[..., :3]*255).astype('uint8').reshape(-1, 3)
    return len(np.unique(a, axis=0)), int(((a.max(1).astype(int) - a.min(1)) > 64).sum())
