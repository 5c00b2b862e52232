fn main() {
    std::process::exit(shoal_node::cli::main());
}
